//! How replicas share one ceiling (issue 14).

pub mod ledger;
