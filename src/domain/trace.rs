//! W3C Trace Context (https://www.w3.org/TR/trace-context/): a request's `traceparent` and
//! `tracestate` parsed by the spec's rules, and a message's own context made from them
//! (contract section 1, "Trace context"): the same trace, a new parent id per message.

use std::fmt;

/// The two names the spec gives a context, in lower case: an HTTP request's headers
/// (`http/headers.rs` makes them header names) and a message's application properties
/// (`backend/`) alike. Spelled here once, where every layer that needs them may import them.
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

/// A `traceparent`: trace id, parent id and flags (version 00 when written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    trace_id: [u8; 16],
    parent_id: [u8; 8],
    flags: u8,
}

impl TraceParent {
    /// The header's value by the spec's rules, or `None` (then ignored: a new trace).
    /// A version above 00 is read by the 00 layout, as the spec says; `ff` is invalid.
    pub fn parse(raw: &str) -> Option<Self> {
        let raw = raw.trim_matches([' ', '\t']);
        let bytes = raw.as_bytes();
        if bytes.len() < 55 {
            return None;
        }
        let version = hex_lower::<1>(&bytes[0..2])?[0];
        if version == 0xff || (version == 0 && bytes.len() != 55) {
            return None;
        }
        if bytes.len() > 55 && bytes[55] != b'-' {
            return None;
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        let trace_id = hex_lower::<16>(&bytes[3..35])?;
        let parent_id = hex_lower::<8>(&bytes[36..52])?;
        let flags = hex_lower::<1>(&bytes[53..55])?[0];
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            parent_id,
            // A version 00 writer keeps only the flags version 00 defines (sampled).
            flags: if version == 0 { flags } else { flags & 0x01 },
        })
    }

    /// A new trace this gateway starts (nothing sampled it: flags 00).
    pub fn root() -> Self {
        Self {
            trace_id: nonzero(rand::random()),
            parent_id: nonzero(rand::random()),
            flags: 0,
        }
    }

    /// The context a message carries: this trace and its flags, a parent id of its own.
    pub fn child(&self) -> Self {
        Self {
            parent_id: nonzero(rand::random()),
            ..*self
        }
    }

    /// A context made elsewhere (an OpenTelemetry span's), as its parts; `None` when the
    /// trace or parent id is all zeros (invalid by the spec).
    pub fn from_parts(trace_id: [u8; 16], parent_id: [u8; 8], sampled: bool) -> Option<Self> {
        (trace_id != [0; 16] && parent_id != [0; 8]).then_some(Self {
            trace_id,
            parent_id,
            flags: u8::from(sampled),
        })
    }

    pub fn trace_id_bytes(&self) -> [u8; 16] {
        self.trace_id
    }

    pub fn parent_id_bytes(&self) -> [u8; 8] {
        self.parent_id
    }

    pub fn flags(&self) -> u8 {
        self.flags
    }

    pub fn trace_id(&self) -> String {
        hex::encode(self.trace_id)
    }

    pub fn parent_id(&self) -> String {
        hex::encode(self.parent_id)
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            hex::encode(self.trace_id),
            hex::encode(self.parent_id),
            self.flags
        )
    }
}

/// A `tracestate` kept as given once it is valid: at most 32 list members of
/// `key=value`, at most 512 characters in all (what the spec asks every vendor to pass on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceState(String);

impl TraceState {
    pub const MAX_CHARS: usize = 512;
    const MAX_MEMBERS: usize = 32;

    /// The header's value (several headers joined by `,`), or `None` when invalid (then
    /// ignored, as the spec says; the `traceparent` still counts).
    pub fn parse(raw: &str) -> Option<Self> {
        if raw.len() > Self::MAX_CHARS {
            return None;
        }
        let mut members = 0;
        let mut keys = Vec::new();
        for member in raw.split(',') {
            let member = member.trim_matches([' ', '\t']);
            if member.is_empty() {
                continue;
            }
            let (key, value) = member.split_once('=')?;
            if !valid_key(key) || !valid_value(value) || keys.contains(&key) {
                return None;
            }
            keys.push(key);
            members += 1;
        }
        if members == 0 || members > Self::MAX_MEMBERS {
            return None;
        }
        Some(Self(raw.trim_matches([' ', '\t']).to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A message's trace context: its `traceparent` and the request's `tracestate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    pub parent: TraceParent,
    pub state: Option<TraceState>,
}

impl TraceContext {
    /// The request's context (a new trace without a valid one), to make messages from.
    pub fn from_request(traceparent: Option<&str>, tracestate: Option<&str>) -> Self {
        // Without a parent, a tracestate means nothing (the spec: discard it).
        Self::given(traceparent, tracestate).unwrap_or_else(|| Self {
            parent: TraceParent::root(),
            state: None,
        })
    }

    /// The request's context when it gave a valid one.
    pub fn given(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Self> {
        traceparent.and_then(TraceParent::parse).map(|parent| Self {
            parent,
            state: tracestate.and_then(TraceState::parse),
        })
    }

    /// One message's context: unique to it.
    pub fn for_message(&self) -> Self {
        Self {
            parent: self.parent.child(),
            state: self.state.clone(),
        }
    }
}

fn nonzero<const N: usize>(mut bytes: [u8; N]) -> [u8; N] {
    if bytes == [0; N] {
        bytes[N - 1] = 1;
    }
    bytes
}

/// `2N` lowercase hex digits (the spec forbids upper case) as `N` bytes.
fn hex_lower<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    if text.len() != 2 * N || !text.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; N];
    hex::decode_to_slice(text, &mut out).ok()?;
    Some(out)
}

/// `simple-key` or `tenant-id@system-id` (the spec's key grammar).
fn valid_key(key: &str) -> bool {
    let part = |s: &str, first_digit_ok: bool, max: usize| {
        let b = s.as_bytes();
        !b.is_empty()
            && b.len() <= max
            && (b[0].is_ascii_lowercase() || (first_digit_ok && b[0].is_ascii_digit()))
            && b.iter().all(|c| {
                c.is_ascii_lowercase()
                    || c.is_ascii_digit()
                    || matches!(c, b'_' | b'-' | b'*' | b'/')
            })
    };
    match key.split_once('@') {
        None => part(key, false, 256),
        Some((tenant, system)) => part(tenant, true, 241) && part(system, false, 14),
    }
}

/// 1–256 printable ASCII characters but `,` and `=`, not ending in a space.
fn valid_value(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 256
        && !value.ends_with(' ')
        && value
            .bytes()
            .all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=')
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_round_trips_and_children_keep_the_trace() {
        let parent = TraceParent::parse(VALID).unwrap();
        assert_eq!(parent.to_string(), VALID);
        let a = parent.child();
        let b = parent.child();
        assert_eq!(a.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_ne!(a.parent_id(), parent.parent_id());
        assert_ne!(a, b, "each message its own parent id");
        assert!(a.to_string().ends_with("-01"), "the flags are kept");
        assert_eq!(TraceParent::parse(&a.to_string()), Some(a));
    }

    #[test]
    fn invalid_traceparents_are_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
        // A later version is read by the 00 layout, and written as 00.
        let later = TraceParent::parse(
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-what-the-future-holds",
        )
        .unwrap();
        assert_eq!(
            later.to_string(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
    }

    #[test]
    fn without_a_valid_parent_the_gateway_starts_a_trace_and_drops_the_state() {
        let fresh = TraceContext::from_request(Some("garbage"), Some("a=b"));
        assert_eq!(fresh.state, None);
        assert_eq!(fresh.parent.to_string().len(), 55);
        assert!(fresh.parent.to_string().ends_with("-00"));
        let other = TraceContext::from_request(None, None);
        assert_ne!(fresh.parent.trace_id(), other.parent.trace_id());
        let kept = TraceContext::from_request(
            Some(VALID),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
        );
        assert_eq!(
            kept.for_message().state.unwrap().as_str(),
            "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
        );
    }

    #[test]
    fn tracestate_follows_the_spec_grammar() {
        for good in ["a=1", "tenant@system=x, b=2", "a-b_c*d/e=v v", "1a@sys=1"] {
            assert!(TraceState::parse(good).is_some(), "{good:?}");
        }
        let members = |n: usize| {
            (0..n)
                .map(|i| format!("k{i}=v"))
                .collect::<Vec<_>>()
                .join(",")
        };
        assert!(TraceState::parse(&members(32)).is_some());
        for bad in [
            String::new(),
            "A=1".into(),
            "a".into(),
            "a=1,a=2".into(),
            "a=x,=b".into(),
            "a=in ner=x".into(),
            "a=é".into(),
            members(33),
            format!("a={}", "v".repeat(600)),
        ] {
            assert!(TraceState::parse(&bad).is_none(), "{bad:?}");
        }
    }
}
