//! [`LedgerPort`] on Redis: each call is one Lua script (`lua/prelude.lua` + `lua/<call>.lua`)
//! over one hash per queue, run as EVALSHA on the [`RedisClient`]'s connection, within its
//! deadline and with its redaction. The scripts are the protocol (docs/fleet.md); this file
//! only lays out their arguments and decodes their replies, and a reply it cannot decode is
//! [`LedgerError::Unexpected`], never a panic: a changed script, a proxy or a foreign key
//! must not take a replica down.

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use redis::{Script, ScriptInvocation, Value};

use super::port::{
    Ask, Caller, Epoch, LedgerError, LedgerPort, QueueRef, ReadFor, ReadOutcome, ReadState,
    ReadTicket, ReserveAnswer, Settle, Terms, View,
};
use super::redis_client::{exact, millis, RedisClient, RedisError};

/// A ledger call on Redis fails as its Redis call did. Only [`RedisClient::lazy`] and
/// [`RedisClient::ping`] meet the other two errors, which no script call returns.
impl From<RedisError> for LedgerError {
    fn from(error: RedisError) -> Self {
        match error {
            RedisError::Timeout => LedgerError::Timeout,
            RedisError::Failed(text) => LedgerError::Redis(text),
            RedisError::Unexpected(text) => LedgerError::Unexpected(text),
            entra @ RedisError::Entra(_) => LedgerError::Redis(entra.to_string()),
        }
    }
}

/// Compiled once per process; each carries its SHA-1, so a call goes as EVALSHA (and as
/// EVAL once after a Redis restart emptied its script cache).
struct Scripts {
    reserve: Script,
    settle: Script,
    heartbeat: Script,
    lease_read: Script,
    publish_read: Script,
    leave: Script,
    look: Script,
}

macro_rules! port_script {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("lua/prelude.lua"),
            include_str!(concat!("lua/", $file))
        ))
    };
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    reserve: port_script!("reserve.lua"),
    settle: port_script!("settle.lua"),
    heartbeat: port_script!("heartbeat.lua"),
    lease_read: port_script!("lease_read.lua"),
    publish_read: port_script!("publish_read.lua"),
    leave: port_script!("leave.lua"),
    look: port_script!("look.lua"),
});

/// `KEYS[1]` and the head of `ARGV` every script takes (see `lua/prelude.lua`): the terms,
/// then the caller. Times in ms; every number clamped to what a Lua double holds exactly.
fn invoke<'a>(script: &'a Script, queue: QueueRef<'_>, caller: Caller<'_>) -> ScriptInvocation<'a> {
    let mut call = script.prepare_invoke();
    call.key(queue.key);
    terms(&mut call, &queue.terms);
    call.arg(caller.replica)
        .arg(exact(caller.seen.id))
        .arg(exact(caller.seen.version))
        .arg(exact(caller.carry));
    call
}

fn terms(call: &mut ScriptInvocation<'_>, t: &Terms) {
    call.arg(millis(t.hold))
        .arg(millis(t.lag))
        .arg(millis(t.max_read_age))
        .arg(millis(t.grace))
        .arg(millis(t.member_for))
        .arg(millis(t.idle).max(1));
}

fn rows(call: &mut ScriptInvocation<'_>, rows: &[Settle<'_>]) {
    for row in rows {
        call.arg(row.block_id)
            .arg(exact(row.stored))
            .arg(exact(row.not_stored));
    }
}

#[async_trait]
impl LedgerPort for RedisClient {
    async fn reserve(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        ask: Ask<'_>,
    ) -> Result<(ReserveAnswer, View), LedgerError> {
        let mut call = invoke(&SCRIPTS.reserve, queue, caller);
        call.arg(ask.block_id)
            .arg(exact(ask.want).max(1))
            .arg(exact(ask.limit))
            .arg(exact(ask.divisor).max(1))
            .arg(millis(ask.lease));
        decode_reserve_answer(&ints(self.run(&call).await?)?, ask.want.max(1))
    }

    async fn settle(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        settled: &[Settle<'_>],
    ) -> Result<View, LedgerError> {
        let mut call = invoke(&SCRIPTS.settle, queue, caller);
        rows(&mut call, settled);
        decode_view(&ints(self.run(&call).await?)?)
    }

    async fn heartbeat(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
    ) -> Result<View, LedgerError> {
        let call = invoke(&SCRIPTS.heartbeat, queue, caller);
        decode_view(&ints(self.run(&call).await?)?)
    }

    async fn lease_read(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        lease: Duration,
    ) -> Result<(Option<ReadTicket>, View), LedgerError> {
        let mut call = invoke(&SCRIPTS.lease_read, queue, caller);
        call.arg(millis(lease));
        decode_ticket(&ints(self.run(&call).await?)?)
    }

    async fn publish_read(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        ticket: ReadTicket,
        outcome: ReadOutcome,
        for_: ReadFor,
    ) -> Result<View, LedgerError> {
        let (ok, backlog, send_disabled) = match outcome {
            ReadOutcome::Ok {
                backlog,
                send_disabled,
            } => (true, backlog, send_disabled),
            ReadOutcome::Failed => (false, 0, false),
        };
        let mut call = invoke(&SCRIPTS.publish_read, queue, caller);
        call.arg(exact(ticket.epoch))
            .arg(exact(ticket.seq))
            .arg(exact(ticket.completed_at_start))
            .arg(u8::from(ok))
            .arg(exact(backlog))
            .arg(u8::from(send_disabled))
            .arg(u8::from(for_.counts_in_streak()))
            .arg(u8::from(for_.paced()))
            .arg(u8::from(for_.ends_lease()));
        decode_view(&ints(self.run(&call).await?)?)
    }

    async fn leave(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        settled: &[Settle<'_>],
    ) -> Result<View, LedgerError> {
        let mut call = invoke(&SCRIPTS.leave, queue, caller);
        rows(&mut call, settled);
        decode_view(&ints(self.run(&call).await?)?)
    }

    async fn look(&self, queue: QueueRef<'_>) -> Result<Option<View>, LedgerError> {
        let mut call = SCRIPTS.look.prepare_invoke();
        call.key(queue.key);
        terms(&mut call, &queue.terms);
        match self.run(&call).await? {
            Value::Nil => Ok(None),
            reply => decode_view(&ints(reply)?).map(Some),
        }
    }

    fn timeout(&self) -> Duration {
        RedisClient::timeout(self)
    }
}

// ---- Replies: arrays of integers, laid out as the scripts' headers say.

fn ints(reply: Value) -> Result<Vec<i64>, LedgerError> {
    match reply {
        Value::Array(items) => items
            .into_iter()
            .map(|item| match item {
                Value::Int(n) => Ok(n),
                other => Err(LedgerError::Unexpected(format!(
                    "expected an integer, got {other:?}"
                ))),
            })
            .collect(),
        other => Err(LedgerError::Unexpected(format!(
            "expected an array, got {other:?}"
        ))),
    }
}

fn count(n: i64, what: &str) -> Result<u64, LedgerError> {
    u64::try_from(n).map_err(|_| LedgerError::Unexpected(format!("{what} is negative ({n})")))
}

fn flag(n: i64, what: &str) -> Result<bool, LedgerError> {
    match n {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(LedgerError::Unexpected(format!(
            "{what} is {other}, not 0 or 1"
        ))),
    }
}

fn ms(n: i64, what: &str) -> Result<Duration, LedgerError> {
    count(n, what).map(Duration::from_millis)
}

const VIEW_LEN: usize = 17;

fn decode_view(v: &[i64]) -> Result<View, LedgerError> {
    let [epoch, version, grace_left, state, backlog, send_disabled, read_age, paced_age, streak, generation, paced, since_read, reserved, carried, replicas, reads_ok, reads_failed] =
        <[i64; VIEW_LEN]>::try_from(v).map_err(|_| {
            LedgerError::Unexpected(format!("a view has {VIEW_LEN} fields, got {}", v.len()))
        })?;
    let read = match state {
        0 => ReadState::Never,
        1 => ReadState::Ok {
            backlog: count(backlog, "backlog")?,
            send_disabled: flag(send_disabled, "send_disabled")?,
        },
        2 => ReadState::Failed { standing: None },
        3 => ReadState::Failed {
            standing: Some(count(backlog, "backlog")?),
        },
        other => {
            return Err(LedgerError::Unexpected(format!(
                "unknown read state {other}"
            )))
        }
    };
    Ok(View {
        epoch: Epoch {
            id: count(epoch, "epoch")?,
            version: count(version, "version")?,
        },
        grace_left: ms(grace_left, "grace_left")?,
        read,
        read_age: ms(read_age, "read_age")?,
        paced_age: ms(paced_age, "paced_age")?,
        // Past u32 it can only mean "failing for ever": saturate rather than refuse.
        streak: u32::try_from(count(streak, "streak")?).unwrap_or(u32::MAX),
        generation: count(generation, "generation")?,
        paced: count(paced, "paced")?,
        since_read: count(since_read, "since_read")?,
        reserved: count(reserved, "reserved")?,
        carried: count(carried, "carried")?,
        replicas: count(replicas, "replicas")?,
        reads_ok: count(reads_ok, "reads_ok")?,
        reads_failed: count(reads_failed, "reads_failed")?,
    })
}

/// `want` as sent: a grant outside `1..=want` is not one this build's script makes.
fn decode_reserve_answer(v: &[i64], want: u64) -> Result<(ReserveAnswer, View), LedgerError> {
    let [kind, n, rest @ ..] = v else {
        return Err(LedgerError::Unexpected(format!(
            "a reservation has {} fields, got {}",
            2 + VIEW_LEN,
            v.len()
        )));
    };
    let view = decode_view(rest)?;
    let n = count(*n, "reservation count")?;
    let reservation = match kind {
        0 if (1..=want).contains(&n) => ReserveAnswer::Granted { granted: n },
        0 => {
            return Err(LedgerError::Unexpected(format!(
                "a grant of {n} for a want of {want}"
            )))
        }
        1 => ReserveAnswer::Full { estimate: n },
        2 => ReserveAnswer::Disabled,
        3 => ReserveAnswer::Unknown,
        4 => ReserveAnswer::Unread,
        5 => ReserveAnswer::Recovering,
        6 => ReserveAnswer::NewEpoch,
        other => {
            return Err(LedgerError::Unexpected(format!(
                "unknown reservation kind {other}"
            )))
        }
    };
    Ok((reservation, view))
}

fn decode_ticket(v: &[i64]) -> Result<(Option<ReadTicket>, View), LedgerError> {
    let [taken, epoch, seq, completed, rest @ ..] = v else {
        return Err(LedgerError::Unexpected(format!(
            "a lease answer has {} fields, got {}",
            4 + VIEW_LEN,
            v.len()
        )));
    };
    let view = decode_view(rest)?;
    let ticket = match taken {
        0 => None,
        1 => Some(ReadTicket {
            epoch: count(*epoch, "ticket epoch")?,
            seq: count(*seq, "ticket seq")?,
            completed_at_start: count(*completed, "completed_at_start")?,
        }),
        other => {
            return Err(LedgerError::Unexpected(format!(
                "a lease answer starts with 0 or 1, got {other}"
            )))
        }
    };
    Ok((ticket, view))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view_fields() -> Vec<i64> {
        vec![
            1_700_000_000_000_000,
            9,
            250,
            1,
            40,
            0,
            1500,
            1700,
            2,
            3,
            2,
            5,
            7,
            11,
            3,
            4,
            1,
        ]
    }

    #[test]
    fn a_well_formed_view_decodes_field_by_field() {
        assert_eq!(
            decode_view(&view_fields()).unwrap(),
            View {
                epoch: Epoch {
                    id: 1_700_000_000_000_000,
                    version: 9
                },
                grace_left: Duration::from_millis(250),
                read: ReadState::Ok {
                    backlog: 40,
                    send_disabled: false
                },
                read_age: Duration::from_millis(1500),
                paced_age: Duration::from_millis(1700),
                streak: 2,
                generation: 3,
                paced: 2,
                since_read: 5,
                reserved: 7,
                carried: 11,
                replicas: 3,
                reads_ok: 4,
                reads_failed: 1,
            }
        );
    }

    #[test]
    fn every_reserve_answer_kind_decodes() {
        let with = |kind: i64, n: i64| {
            let mut v = vec![kind, n];
            v.extend(view_fields());
            decode_reserve_answer(&v, 32).unwrap().0
        };
        assert_eq!(with(0, 4), ReserveAnswer::Granted { granted: 4 });
        assert_eq!(with(1, 50), ReserveAnswer::Full { estimate: 50 });
        assert_eq!(with(2, 0), ReserveAnswer::Disabled);
        assert_eq!(with(3, 0), ReserveAnswer::Unknown);
        assert_eq!(with(4, 0), ReserveAnswer::Unread);
        assert_eq!(with(5, 0), ReserveAnswer::Recovering);
        assert_eq!(with(6, 0), ReserveAnswer::NewEpoch);
    }

    #[test]
    fn a_ticket_and_its_absence_decode() {
        let with = |head: [i64; 4]| {
            let mut v = head.to_vec();
            v.extend(view_fields());
            decode_ticket(&v).unwrap().0
        };
        assert_eq!(with([0, 0, 0, 0]), None);
        assert_eq!(
            with([1, 77, 4, 12]),
            Some(ReadTicket {
                epoch: 77,
                seq: 4,
                completed_at_start: 12
            })
        );
    }

    #[test]
    fn malformed_replies_are_errors_never_panics() {
        for v in [
            Value::Nil,
            Value::Okay,
            Value::Int(7),
            Value::SimpleString("PONG".into()),
            Value::Array(vec![Value::Int(1), Value::Nil]),
            Value::Array(vec![Value::BulkString(b"1".to_vec())]),
        ] {
            assert!(ints(v.clone()).is_err(), "{v:?}");
        }
        let failed = |state: i64, backlog: i64| {
            let mut fields = view_fields();
            fields[3] = state;
            fields[4] = backlog;
            decode_view(&fields).map(|v| v.read)
        };
        assert_eq!(failed(2, 0).unwrap(), ReadState::Failed { standing: None });
        assert_eq!(
            failed(3, 7).unwrap(),
            ReadState::Failed { standing: Some(7) },
            "the last good read's backlog stands"
        );
        assert!(failed(3, -5).is_err());
        let mut short = view_fields();
        short.pop();
        assert!(decode_view(&short).is_err());
        let mut long = view_fields();
        long.push(0);
        assert!(decode_view(&long).is_err());
        for (index, value) in [(0, -1), (1, -1), (2, -1), (3, 4), (4, -5), (5, 2), (6, -1)] {
            let mut fields = view_fields();
            fields[index] = value;
            assert!(decode_view(&fields).is_err(), "field {index} = {value}");
        }
        for index in 7..VIEW_LEN {
            let mut fields = view_fields();
            fields[index] = -1;
            assert!(decode_view(&fields).is_err(), "field {index} = -1");
        }
        let reservation = |kind: i64, n: i64, want: u64| {
            let mut v = vec![kind, n];
            v.extend(view_fields());
            decode_reserve_answer(&v, want)
        };
        assert!(reservation(0, 0, 8).is_err(), "a grant of 0");
        assert!(reservation(0, 9, 8).is_err(), "a grant above the want");
        assert!(reservation(0, -1, 8).is_err());
        assert!(reservation(1, -1, 8).is_err());
        assert!(reservation(7, 0, 8).is_err());
        assert!(decode_reserve_answer(&[], 8).is_err());
        assert!(decode_reserve_answer(&[0, 1], 8).is_err());
        let ticket = |head: [i64; 4]| {
            let mut v = head.to_vec();
            v.extend(view_fields());
            decode_ticket(&v)
        };
        assert!(ticket([2, 0, 0, 0]).is_err());
        assert!(ticket([1, -1, 1, 0]).is_err());
        assert!(ticket([1, 1, -1, 0]).is_err());
        assert!(ticket([1, 1, 1, -1]).is_err());
        assert!(decode_ticket(&[1, 1, 1]).is_err());
    }

    #[test]
    fn a_huge_streak_saturates_rather_than_fails() {
        let mut fields = view_fields();
        fields[8] = i64::from(u32::MAX) + 10;
        assert_eq!(decode_view(&fields).unwrap().streak, u32::MAX);
    }
}
