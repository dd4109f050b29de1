//! Parsing what the Service Bus management (ATOM) endpoint answers: a queue's description
//! (`GET {ns}/{queue}?api-version=2021-05`) and its `<Error>` bodies.
//!
//! The input comes from the network, so every malformed, truncated or hostile document
//! is a clean [`AtomError`], never a panic: the body is capped in size, elements are
//! matched by local name (the `d2p1` prefix of `CountDetails` is the serializer's choice,
//! not a contract), nesting is bounded, and a DTD (entity declarations, the "billion
//! laughs") is refused outright: quick-xml never expands entities, and a queue
//! description never has a DTD.

use quick_xml::events::Event;
use quick_xml::Reader;

/// Largest body parsed. A queue description is about 2 KiB; anything near this is not one.
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

/// Deeper than any description (`entry/content/QueueDescription/AuthorizationRules/...`
/// is 7 levels); a deeper document is refused before it costs anything.
const MAX_DEPTH: usize = 64;

/// The longest error detail kept from an `<Error>` body.
pub const MAX_DETAIL_CHARS: usize = 512;

/// What a `GET {ns}/{queue}` body says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueDescription {
    /// An ATOM `entry` holding a `QueueDescription`.
    Found(QueueRuntime),
    /// An empty ATOM `feed`: Service Bus answers 200 with this for a queue that does not
    /// exist (the official SDKs read it the same way).
    NotFound,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueRuntime {
    /// `CountDetails/ActiveMessageCount`: waiting to be received.
    pub active: u64,
    /// `CountDetails/ScheduledMessageCount`: will become active without another send.
    pub scheduled: u64,
    pub status: EntityStatus,
}

impl QueueRuntime {
    /// The backlog as the contract defines it: active + scheduled, dead letters excluded.
    pub fn backlog(&self) -> u64 {
        self.active.saturating_add(self.scheduled)
    }
}

/// The queue's `Status`, as far as sending is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntityStatus {
    /// `Active`, `ReceiveDisabled`, and states that do not refuse sends.
    AcceptsSends,
    /// `Disabled` or `SendDisabled`.
    SendDisabled,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AtomError {
    #[error("the body is larger than {MAX_DOCUMENT_BYTES} bytes")]
    TooLarge,
    #[error("the body is not UTF-8")]
    NotUtf8,
    #[error("the body is not well-formed XML: {0}")]
    Malformed(String),
    #[error("the body declares a DTD, which a queue description never has")]
    Dtd,
    #[error("the XML nests deeper than {MAX_DEPTH} elements")]
    TooDeep,
    #[error("the document ends before its root element is closed")]
    Truncated,
    #[error("the body holds no XML element")]
    Empty,
    #[error("unexpected root element <{0}>: neither an ATOM entry nor a feed")]
    UnexpectedRoot(String),
    #[error("the entry holds no QueueDescription/CountDetails/{0}")]
    Missing(&'static str),
    #[error("{0} appears twice")]
    Duplicate(&'static str),
    #[error("{field} is not a whole number: {value:?}")]
    NotANumber { field: &'static str, value: String },
}

/// The fields read from a description, by their path of local names under the root.
const ACTIVE: [&str; 4] = [
    "content",
    "QueueDescription",
    "CountDetails",
    "ActiveMessageCount",
];
const SCHEDULED: [&str; 4] = [
    "content",
    "QueueDescription",
    "CountDetails",
    "ScheduledMessageCount",
];
const STATUS: [&str; 3] = ["content", "QueueDescription", "Status"];

/// Parse the body of a 200 answer to `GET {ns}/{queue}`.
pub fn parse_queue_description(body: &[u8]) -> Result<QueueDescription, AtomError> {
    let mut active = None;
    let mut scheduled = None;
    let mut status = None;
    let root = walk(body, |path, text| {
        let (slot, field) = if path == ACTIVE {
            (&mut active, "ActiveMessageCount")
        } else if path == SCHEDULED {
            (&mut scheduled, "ScheduledMessageCount")
        } else if path == STATUS {
            (&mut status, "Status")
        } else {
            return Ok(());
        };
        if slot.replace(text.trim().to_owned()).is_some() {
            return Err(AtomError::Duplicate(field));
        }
        Ok(())
    })?;
    match root.as_str() {
        "feed" => return Ok(QueueDescription::NotFound),
        "entry" => {}
        _ => return Err(AtomError::UnexpectedRoot(root)),
    }
    let active = count("ActiveMessageCount", active)?;
    let scheduled = count("ScheduledMessageCount", scheduled)?;
    // A missing Status is read as "accepts sends": the send itself will tell otherwise.
    let status = match status.as_deref() {
        Some("Disabled" | "SendDisabled") => EntityStatus::SendDisabled,
        _ => EntityStatus::AcceptsSends,
    };
    Ok(QueueDescription::Found(QueueRuntime {
        active,
        scheduled,
        status,
    }))
}

/// The `<Detail>` of an `<Error><Code>..</Code><Detail>..</Detail></Error>` body, if the
/// body is one; shortened to a log-friendly length.
pub fn error_detail(body: &[u8]) -> Option<String> {
    let mut detail = None;
    let root = walk(body, |path, text| {
        if path == ["Detail"] && detail.is_none() {
            detail = Some(text.trim().to_owned());
        }
        Ok(())
    })
    .ok()?;
    if root != "Error" {
        return None;
    }
    detail
        .filter(|d| !d.is_empty())
        .map(|d| shorten(&d, MAX_DETAIL_CHARS))
}

/// Cut `text` to at most `max` characters, marking the cut.
pub fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((at, _)) => format!("{}…", &text[..at]),
    }
}

fn count(field: &'static str, value: Option<String>) -> Result<u64, AtomError> {
    let value = value.ok_or(AtomError::Missing(field))?;
    value
        .parse::<u64>()
        .map_err(|_| AtomError::NotANumber { field, value })
}

/// Read the whole document, calling `on_text(path, text)` once for every element that
/// directly holds text, with `path` the local names from below the root down to the
/// element. Returns the root's local name.
fn walk(
    body: &[u8],
    mut on_text: impl FnMut(&[&str], &str) -> Result<(), AtomError>,
) -> Result<String, AtomError> {
    if body.len() > MAX_DOCUMENT_BYTES {
        return Err(AtomError::TooLarge);
    }
    let xml = std::str::from_utf8(body).map_err(|_| AtomError::NotUtf8)?;
    let mut reader = Reader::from_str(xml);
    // Mismatched end tags are errors (the default), so a cut-and-spliced body is refused.
    reader.config_mut().check_end_names = true;

    let mut walked = Walked::default();
    loop {
        let event = reader
            .read_event()
            .map_err(|e| AtomError::Malformed(e.to_string()))?;
        match event {
            Event::Start(start) => walked.open(start.local_name().as_ref().to_owned())?,
            Event::Empty(start) => walked.empty(start.local_name().as_ref().to_owned())?,
            Event::End(_) => walked.close(&mut on_text)?,
            Event::Text(t) => walked.text.push_str(&t.xml10_content()),
            Event::CData(c) => walked.text.push_str(&c),
            Event::GeneralRef(r) => match resolve_reference(&r)? {
                Some(c) => walked.text.push(c),
                None => {
                    return Err(AtomError::Malformed(format!(
                        "undeclared entity reference &{};",
                        &*r
                    )))
                }
            },
            Event::DocType(_) => return Err(AtomError::Dtd),
            Event::Decl(_) | Event::PI(_) | Event::Comment(_) => {}
            Event::Eof => break,
        }
    }
    walked.root()
}

/// Where [`walk`] is in the document: the root element, whether it closed, the open
/// elements below it and the text of the innermost one so far.
#[derive(Default)]
struct Walked {
    root: Option<String>,
    closed_root: bool,
    /// Local names of the open elements below the root.
    path: Vec<String>,
    text: String,
}

impl Walked {
    /// An element opens: the root, or one more level below it.
    fn open(&mut self, name: String) -> Result<(), AtomError> {
        self.text.clear();
        match &self.root {
            None => self.root = Some(name),
            Some(_) if self.closed_root => {
                return Err(AtomError::Malformed(
                    "a second root element follows the first".into(),
                ))
            }
            Some(_) => {
                if self.path.len() >= MAX_DEPTH {
                    return Err(AtomError::TooDeep);
                }
                self.path.push(name);
            }
        }
        Ok(())
    }

    /// An element without content (`<x/>`): a whole root, or nothing below it.
    fn empty(&mut self, name: String) -> Result<(), AtomError> {
        if self.root.is_none() {
            self.root = Some(name);
            self.closed_root = true;
        } else if self.closed_root {
            return Err(AtomError::Malformed(
                "a second root element follows the first".into(),
            ));
        }
        self.text.clear();
        Ok(())
    }

    /// An element closes: the root, or one below it, whose text (if any) is handed on.
    fn close(
        &mut self,
        on_text: &mut impl FnMut(&[&str], &str) -> Result<(), AtomError>,
    ) -> Result<(), AtomError> {
        if self.path.is_empty() {
            self.closed_root = true;
            return Ok(());
        }
        if !self.text.is_empty() {
            let names: Vec<&str> = self.path.iter().map(String::as_str).collect();
            on_text(&names, &self.text)?;
            self.text.clear();
        }
        self.path.pop();
        Ok(())
    }

    /// The root's local name, once the document ended: an error unless it held one
    /// root, closed.
    fn root(self) -> Result<String, AtomError> {
        match self.root {
            None => Err(AtomError::Empty),
            Some(_) if !self.closed_root => Err(AtomError::Truncated),
            Some(root) => Ok(root),
        }
    }
}

/// A character reference (`&#48;`) or one of XML's five predefined entities; anything else
/// could only have been declared in a DTD, which is refused.
fn resolve_reference(r: &quick_xml::events::BytesRef<'_>) -> Result<Option<char>, AtomError> {
    if r.is_char_ref() {
        return r
            .resolve_char_ref()
            .map_err(|e| AtomError::Malformed(e.to_string()));
    }
    Ok(match &**r {
        "lt" => Some('<'),
        "gt" => Some('>'),
        "amp" => Some('&'),
        "apos" => Some('\''),
        "quot" => Some('"'),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FOUND: &str =
        include_str!("../../../tests/data/servicebus/queue_runtime_properties_200.xml");
    const NOT_FOUND: &str =
        include_str!("../../../tests/data/servicebus/queue_not_found_200_feed.xml");
    const CLAIM_EMPTY: &str =
        include_str!("../../../tests/data/servicebus/management_401_claim_empty.xml");

    /// The recorded description with its counts (and optionally its status) rewritten.
    fn description(active: &str, dead: &str, scheduled: &str, status: &str) -> String {
        FOUND
            .replace(
                "<d2p1:ActiveMessageCount>0</d2p1:ActiveMessageCount>",
                &format!("<d2p1:ActiveMessageCount>{active}</d2p1:ActiveMessageCount>"),
            )
            .replace(
                "<d2p1:DeadLetterMessageCount>0</d2p1:DeadLetterMessageCount>",
                &format!("<d2p1:DeadLetterMessageCount>{dead}</d2p1:DeadLetterMessageCount>"),
            )
            .replace(
                "<d2p1:ScheduledMessageCount>0</d2p1:ScheduledMessageCount>",
                &format!("<d2p1:ScheduledMessageCount>{scheduled}</d2p1:ScheduledMessageCount>"),
            )
            .replace(
                "<Status>Active</Status>",
                &format!("<Status>{status}</Status>"),
            )
    }

    fn found(xml: &str) -> QueueRuntime {
        match parse_queue_description(xml.as_bytes()) {
            Ok(QueueDescription::Found(q)) => q,
            other => panic!("expected a description, got {other:?}"),
        }
    }

    #[test]
    fn the_recorded_description_has_an_empty_active_queue() {
        let q = found(FOUND);
        assert_eq!(q.active, 0);
        assert_eq!(q.scheduled, 0);
        assert_eq!(q.status, EntityStatus::AcceptsSends);
    }

    #[test]
    fn the_backlog_is_active_plus_scheduled_without_dead_letters() {
        let xml = description("12", "500", "3", "Active");
        assert_ne!(xml, FOUND, "the rewrite changed the recorded body");
        let q = found(&xml);
        assert_eq!((q.active, q.scheduled), (12, 3));
        assert_eq!(q.backlog(), 15);
    }

    #[test]
    fn disabled_and_send_disabled_refuse_sends_receive_disabled_does_not() {
        for (status, expected) in [
            ("Active", EntityStatus::AcceptsSends),
            ("Disabled", EntityStatus::SendDisabled),
            ("SendDisabled", EntityStatus::SendDisabled),
            ("ReceiveDisabled", EntityStatus::AcceptsSends),
        ] {
            assert_eq!(
                found(&description("0", "0", "0", status)).status,
                expected,
                "{status}"
            );
        }
    }

    #[test]
    fn counts_are_matched_by_local_name_whatever_the_prefix() {
        let other_prefix = FOUND.replace("d2p1", "x");
        assert_eq!(found(&other_prefix).active, 0);
        let no_prefix = description("7", "0", "1", "Active").replace("d2p1:", "");
        assert_eq!(found(&no_prefix).backlog(), 8);
    }

    #[test]
    fn a_count_outside_count_details_is_not_the_backlog() {
        // MessageCount (which includes dead letters) sits beside CountDetails.
        let xml = description("1", "40", "0", "Active").replace(
            "<MessageCount>0</MessageCount>",
            "<MessageCount>41</MessageCount>",
        );
        assert_eq!(found(&xml).backlog(), 1);
    }

    #[test]
    fn the_empty_feed_means_the_queue_does_not_exist() {
        assert_eq!(
            parse_queue_description(NOT_FOUND.as_bytes()),
            Ok(QueueDescription::NotFound)
        );
    }

    #[test]
    fn the_error_detail_is_read_from_the_401_body() {
        let detail = error_detail(CLAIM_EMPTY.as_bytes()).unwrap();
        assert!(
            detail.starts_with("claim is empty. TrackingId:"),
            "{detail}"
        );
        assert_eq!(error_detail(b"not xml at all"), None);
        assert_eq!(error_detail(FOUND.as_bytes()), None);
        let escaped = b"<Error><Code>403</Code><Detail>a &lt;b&gt; &amp; &#99;</Detail></Error>";
        assert_eq!(error_detail(escaped).as_deref(), Some("a <b> & c"));
    }

    #[test]
    fn an_error_body_is_not_a_description() {
        assert_eq!(
            parse_queue_description(CLAIM_EMPTY.as_bytes()),
            Err(AtomError::UnexpectedRoot("Error".into()))
        );
    }

    #[test]
    fn every_truncation_of_the_recorded_body_fails_cleanly() {
        for cut in 0..FOUND.len() {
            if !FOUND.is_char_boundary(cut) {
                continue;
            }
            let result = parse_queue_description(&FOUND.as_bytes()[..cut]);
            assert!(result.is_err(), "cut at {cut}: {result:?}");
        }
        // A cut in the middle of a multi-byte character is not UTF-8.
        assert_eq!(
            parse_queue_description("<entry>é".as_bytes().split_last().unwrap().1),
            Err(AtomError::NotUtf8)
        );
    }

    #[test]
    fn malformed_documents_fail_cleanly() {
        let cases: &[&[u8]] = &[
            b"",
            b"   ",
            b"garbage",
            b"{\"json\": true}",
            b"<entry><content></entry>",
            b"<entry></entry><entry></entry>",
            b"<entry><a></b></entry>",
            b"<entry attr=></entry>",
            b"<entry>&bogus;</entry>",
            b"<entry>&#0;</entry>",
            b"\xff\xfe<\x00e\x00",
        ];
        for body in cases {
            assert!(
                parse_queue_description(body).is_err(),
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn missing_duplicate_or_non_numeric_counts_fail() {
        let no_counts = FOUND.replace("ActiveMessageCount", "SomethingElse");
        assert_eq!(
            parse_queue_description(no_counts.as_bytes()),
            Err(AtomError::Missing("ActiveMessageCount"))
        );
        let twice = FOUND.replace(
            "<d2p1:DeadLetterMessageCount>",
            "<d2p1:ActiveMessageCount>1</d2p1:ActiveMessageCount><d2p1:DeadLetterMessageCount>",
        );
        assert_eq!(
            parse_queue_description(twice.as_bytes()),
            Err(AtomError::Duplicate("ActiveMessageCount"))
        );
        for bad in ["-1", "1.5", "lots", "", "18446744073709551616"] {
            let xml = description(bad, "0", "0", "Active");
            assert!(
                matches!(
                    parse_queue_description(xml.as_bytes()),
                    Err(AtomError::NotANumber { .. } | AtomError::Missing(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_huge_sum_saturates_instead_of_overflowing() {
        let max = u64::MAX.to_string();
        assert_eq!(
            found(&description(&max, "0", &max, "Active")).backlog(),
            u64::MAX
        );
    }

    #[test]
    fn deeply_nested_documents_are_refused() {
        for depth in [MAX_DEPTH + 1, 1_000, 100_000] {
            let xml = format!(
                "<entry>{}{}</entry>",
                "<a>".repeat(depth),
                "</a>".repeat(depth)
            );
            assert_eq!(
                parse_queue_description(xml.as_bytes()),
                Err(AtomError::TooDeep),
                "{depth}"
            );
        }
        // Unclosed, the same nesting is refused for its depth before its end is missed.
        let xml = format!("<entry>{}", "<a>".repeat(100_000));
        assert_eq!(
            parse_queue_description(xml.as_bytes()),
            Err(AtomError::TooDeep)
        );
    }

    #[test]
    fn huge_documents_are_refused_before_parsing() {
        let padding = " ".repeat(MAX_DOCUMENT_BYTES);
        let xml = FOUND.replace("<content", &format!("{padding}<content"));
        assert_eq!(
            parse_queue_description(xml.as_bytes()),
            Err(AtomError::TooLarge)
        );
    }

    #[test]
    fn entity_declarations_are_refused_not_expanded() {
        let laughs = r#"<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
]>
<entry><content><QueueDescription><CountDetails><ActiveMessageCount>&lol3;</ActiveMessageCount></CountDetails></QueueDescription></content></entry>"#;
        assert_eq!(
            parse_queue_description(laughs.as_bytes()),
            Err(AtomError::Dtd)
        );
        let external =
            r#"<!DOCTYPE entry [<!ENTITY x SYSTEM "file:///etc/passwd">]><entry>&x;</entry>"#;
        assert_eq!(
            parse_queue_description(external.as_bytes()),
            Err(AtomError::Dtd)
        );
        // Without a DTD, an undeclared entity is simply an error.
        let xml = description("&lol;", "0", "0", "Active");
        assert!(parse_queue_description(xml.as_bytes()).is_err());
    }

    #[test]
    fn a_character_reference_in_a_count_is_still_a_number() {
        let xml = description("&#52;2", "0", "0", "Active");
        assert_eq!(found(&xml).active, 42);
    }

    #[test]
    fn shorten_cuts_on_character_boundaries() {
        assert_eq!(shorten("abc", 5), "abc");
        assert_eq!(shorten("ééé", 2), "éé…");
    }
}
