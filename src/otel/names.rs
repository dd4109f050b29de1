//! The queue and tenant names a span record holds, shared: a send clones an `Arc` instead
//! of copying its queue's and tenant's names, and the export thread drops the clone.
//!
//! The names are configured ones (a served queue or `unknown`, a key's or an app's tenant),
//! not a client's input, so the set stays small; past [`MAX_NAMES`] (a keys file reloaded
//! many times with new tenants) a name is copied instead of kept.

use std::collections::HashSet;
use std::sync::Arc;

use parking_lot::Mutex;

pub(super) const MAX_NAMES: usize = 4096;

#[derive(Debug, Default)]
pub(super) struct Names(Mutex<HashSet<Arc<str>, foldhash::fast::RandomState>>);

impl Names {
    /// `name`, shared.
    pub(super) fn get(&self, name: &str) -> Arc<str> {
        let mut names = self.0.lock();
        if let Some(kept) = names.get(name) {
            return Arc::clone(kept);
        }
        let made: Arc<str> = Arc::from(name);
        if names.len() < MAX_NAMES {
            names.insert(Arc::clone(&made));
        }
        made
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_shared_and_past_the_bound_copied() {
        let names = Names::default();
        let a = names.get("requests");
        assert!(Arc::ptr_eq(&a, &names.get("requests")));
        assert_eq!(&*names.get("other"), "other");
        for n in 0..MAX_NAMES {
            names.get(&format!("tenant-{n}"));
        }
        assert_eq!(names.0.lock().len(), MAX_NAMES);
        let late = names.get("late");
        assert_eq!(&*late, "late");
        assert!(!Arc::ptr_eq(&late, &names.get("late")), "not kept");
        assert!(
            Arc::ptr_eq(&a, &names.get("requests")),
            "the first still are"
        );
    }
}
