//! Every open connection, its phase and its seat: what [`super::Connections`] admits,
//! counts and asks to close (the rules are the module's, `transport/mod.rs`).
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Waker;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::trim::Trimmer;
use crate::config::ConnectionLimits as Limits;

/// Why the server closed a connection (or, `Done`, the connection ended otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Closed {
    Done = 1,
    HeaderTimeout,
    HeadTooLarge,
    HeadBudget,
    /// Closed to make room for a new connection.
    Evicted,
    /// Refused at once: the peer has its cap.
    PeerLimit,
    /// Refused at once: full, and every connection has a request in progress.
    Full,
    /// Answered, it did not finish sending a body or go away within the deadline.
    Stalled,
}

impl Closed {
    pub const ALL: [Closed; 8] = [
        Closed::Done,
        Closed::HeaderTimeout,
        Closed::HeadTooLarge,
        Closed::HeadBudget,
        Closed::Evicted,
        Closed::PeerLimit,
        Closed::Full,
        Closed::Stalled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Closed::Done => "done",
            Closed::HeaderTimeout => "header_timeout",
            Closed::HeadTooLarge => "head_too_large",
            Closed::HeadBudget => "head_budget",
            Closed::Evicted => "evicted",
            Closed::PeerLimit => "peer_limit",
            Closed::Full => "full",
            Closed::Stalled => "stalled",
        }
    }

    fn from_u8(n: u8) -> Option<Closed> {
        Closed::ALL.into_iter().find(|c| *c as u8 == n)
    }
}

/// Where a connection is, for the gauge and for choosing whom to close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Between requests: nothing to answer, no head arriving.
    Idle = 0,
    /// A head arriving (a fresh connection's first, before any byte, too).
    Head = 1,
    /// A request in progress: its body arriving, or its answer not yet written.
    Busy = 2,
}

impl Phase {
    pub const ALL: [Phase; 3] = [Phase::Idle, Phase::Head, Phase::Busy];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Head => "head",
            Phase::Busy => "busy",
        }
    }
}

/// One connection as the registry sees it; the stream updates it, the registry may ask it
/// to close.
#[derive(Debug)]
struct Slot {
    phase: AtomicU8,
    /// When it entered its phase, in ms after the registry's origin.
    since_ms: AtomicU64,
    /// A [`Closed`] the registry asked for (0: none).
    close: AtomicU8,
    /// Bytes of its unfinished head counted in the budget.
    head_bytes: AtomicUsize,
    /// The task to wake when asked to close.
    waker: Mutex<Option<Waker>>,
}

/// Every open connection of the process (all workers), and what closed the others.
pub struct Connections {
    pub(super) limits: Limits,
    origin: Instant,
    trimmer: Arc<Trimmer>,
    registry: Mutex<Registry>,
    head_bytes: AtomicUsize,
    closed: [AtomicU64; Closed::ALL.len()],
}

/// How many connections a choice of whom to close looks at: all of them up to this many,
/// else this many picked at random (as Redis picks what to evict), so choosing costs the
/// same at 10,000 connections as at 64 — a flood at the limit makes a choice per accept
/// (measured: a scan of all 10,000 per accept took 60 % of the gateway's CPU). Of the
/// connections that owe something first ([`Registry::owing`]), then of all: a sample of
/// all would miss the few that owe among many idle ones (1 in 512: 88 % of the time).
pub(super) const SAMPLE: usize = 64;

/// A place not in [`Registry::owing`].
const NOT_OWING: usize = usize::MAX;

/// Where a choice of whom to close looks.
#[derive(Debug, Clone, Copy)]
enum Among {
    /// The connections that owe something (phase `Head`), not yet asked to close.
    Owing,
    All,
}

#[derive(Default)]
struct Registry {
    next: u64,
    /// Open connections by place: `(id, slot)`; a closed one's place is reused. It never
    /// shrinks (a place in `free` or held by a seat stays valid): at most the most seats
    /// ever held at once, which actix-server keeps under twice `max_connections` per worker.
    slots: Vec<Option<(u64, Arc<Slot>)>>,
    free: Vec<usize>,
    /// The places of connections in phase `Head` (what they owe has a deadline), in no
    /// order; a seat moves itself in and out as its phase changes, and out when asked to
    /// close. A phase swapped and not yet moved (microseconds) is checked by its phase.
    owing: Vec<usize>,
    /// Per place, its index in `owing` ([`NOT_OWING`]: not there).
    owing_at: Vec<usize>,
    open: usize,
    peers: HashMap<IpAddr, usize>,
}

impl Registry {
    fn owes(&mut self, place: usize) {
        if self.owing_at[place] == NOT_OWING {
            self.owing_at[place] = self.owing.len();
            self.owing.push(place);
        }
    }

    fn owes_nothing(&mut self, place: usize) {
        let at = std::mem::replace(&mut self.owing_at[place], NOT_OWING);
        if at != NOT_OWING {
            self.owing.swap_remove(at);
            if let Some(&moved) = self.owing.get(at) {
                self.owing_at[moved] = at;
            }
        }
    }

    /// Room for one more connection from `peer`: refused when the peer has its cap;
    /// past the limit, one connection is asked to close, or, when none may be, refused.
    fn make_room(&mut self, peer: Option<IpAddr>, limits: &Limits) -> Result<(), Closed> {
        if let Some(ip) = peer {
            let mine = self.peers.get(&ip).copied().unwrap_or(0);
            if limits.per_peer > 0 && mine >= limits.per_peer {
                return Err(Closed::PeerLimit);
            }
        }
        if self.open >= limits.max_connections {
            self.evict_one()?;
        }
        Ok(())
    }

    /// Ask one connection without a request in progress to close: one that owes something
    /// (a head, the rest of a body) before one that is idle, then the longest in its phase;
    /// of two as old, the one accepted first. A client's pooled connection is idle; a
    /// flood's fresh ones owe their heads. `Full` when every connection is busy.
    fn evict_one(&mut self) -> Result<(), Closed> {
        let evictable = |_: u64, s: &Slot| {
            s.phase.load(Ordering::Acquire) != Phase::Busy as u8
                && s.close.load(Ordering::Acquire) == 0
        };
        let key = |id: u64, s: &Slot| {
            let idle = s.phase.load(Ordering::Acquire) == Phase::Idle as u8;
            (idle, s.since_ms.load(Ordering::Acquire), id)
        };
        let victim = self
            .least(Among::Owing, evictable, key)
            .or_else(|| self.least(Among::All, evictable, key));
        let (_, place, slot) = victim.ok_or(Closed::Full)?;
        slot.ask_to_close(Closed::Evicted);
        self.owes_nothing(place);
        Ok(())
    }

    /// A place for a new connection's `slot`, under a new id: `(id, place)`. A fresh
    /// connection owes its first head.
    fn seat(&mut self, peer: Option<IpAddr>, slot: &Arc<Slot>) -> (u64, usize) {
        let id = self.next;
        self.next += 1;
        let place = match self.free.pop() {
            Some(place) => {
                self.slots[place] = Some((id, Arc::clone(slot)));
                place
            }
            None => {
                self.slots.push(Some((id, Arc::clone(slot))));
                self.owing_at.push(NOT_OWING);
                self.slots.len() - 1
            }
        };
        self.owes(place);
        self.open += 1;
        if let Some(ip) = peer {
            *self.peers.entry(ip).or_default() += 1;
        }
        (id, place)
    }

    /// The connection with the least `key` among those `keep` accepts, its key and its
    /// place: of all those `among` names, or of a random sample of [`SAMPLE`] of them when
    /// there are more (the least of the sample: close to the least of all, not always it).
    fn least<K: Ord>(
        &self,
        among: Among,
        keep: impl Fn(u64, &Slot) -> bool,
        key: impl Fn(u64, &Slot) -> K,
    ) -> Option<(K, usize, Arc<Slot>)> {
        let len = match among {
            Among::Owing => self.owing.len(),
            Among::All => self.slots.len(),
        };
        let consider = |i: usize| {
            let place = match among {
                Among::Owing => self.owing[i],
                Among::All => i,
            };
            let (id, slot) = self.slots[place].as_ref()?;
            keep(*id, slot).then(|| (key(*id, slot), place))
        };
        let all = || (0..len).filter_map(consider).min_by(|a, b| a.0.cmp(&b.0));
        let best = if len <= SAMPLE {
            all()
        } else {
            // A sample that finds none (of all: nearly every connection busy, real work,
            // which no client can make up) looks at all of them.
            (0..SAMPLE)
                .map(|_| rand::random_range(0..len))
                .filter_map(consider)
                .min_by(|a, b| a.0.cmp(&b.0))
                .or_else(all)
        };
        let (k, place) = best?;
        self.slots[place]
            .as_ref()
            .map(|(_, slot)| (k, place, Arc::clone(slot)))
    }
}

/// What `/metrics` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionCounts {
    pub open: Vec<(Phase, u64)>,
    pub closed: Vec<(Closed, u64)>,
    pub head_bytes: u64,
}

impl Slot {
    fn ask_to_close(&self, why: Closed) {
        self.close.store(why as u8, Ordering::Release);
        if let Some(waker) = self.waker.lock().take() {
            waker.wake();
        }
    }
}

impl Connections {
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            origin: Instant::now(),
            trimmer: Arc::default(),
            registry: Mutex::new(Registry::default()),
            head_bytes: AtomicUsize::new(0),
            closed: std::array::from_fn(|_| AtomicU64::new(0)),
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// A connection just accepted from `peer`: its seat, or why it is refused. Past the
    /// limit, the connection waiting longest without a request in progress is asked to close.
    pub fn admit(self: &Arc<Self>, peer: Option<IpAddr>) -> Result<Seat, Closed> {
        let peer = peer.map(peer_key);
        let now = self.now_ms();
        let mut registry = self.registry.lock();
        if let Err(refused) = registry.make_room(peer, &self.limits) {
            drop(registry);
            self.count(refused);
            return Err(refused);
        }
        let slot = Arc::new(Slot {
            phase: AtomicU8::new(Phase::Head as u8),
            since_ms: AtomicU64::new(now),
            close: AtomicU8::new(0),
            head_bytes: AtomicUsize::new(0),
            waker: Mutex::new(None),
        });
        let (id, place) = registry.seat(peer, &slot);
        Ok(Seat {
            connections: Arc::clone(self),
            id,
            place,
            peer,
            slot,
            head_bytes: 0,
            closed: Closed::Done,
        })
    }

    pub fn counts(&self) -> ConnectionCounts {
        let mut by_phase = [0u64; 3];
        for (_, slot) in self.registry.lock().slots.iter().flatten() {
            let phase = slot.phase.load(Ordering::Acquire) as usize;
            if let Some(n) = by_phase.get_mut(phase) {
                *n += 1;
            }
        }
        ConnectionCounts {
            open: Phase::ALL.into_iter().zip(by_phase).collect(),
            closed: Closed::ALL
                .into_iter()
                .zip(self.closed.iter().map(|c| c.load(Ordering::Relaxed)))
                .collect(),
            head_bytes: self.head_bytes.load(Ordering::Relaxed) as u64,
        }
    }

    /// The heads' budget is past: the head that has been arriving longest makes room, if
    /// it is not `seat`'s own (a normal head arrives in milliseconds; one held for seconds
    /// is the flood's). Its bytes count until it closes, so the budget may be passed by a
    /// head or so meanwhile. Whether `seat` may keep its bytes.
    fn make_head_room(&self, seat: &Seat) -> bool {
        let mut registry = self.registry.lock();
        // Its own head arrives since its phase became `Head`; a reused connection's is only
        // settled after this (still idle: its idle time is no head's), so it begins now.
        let mine = if seat.slot.phase.load(Ordering::Acquire) == Phase::Head as u8 {
            seat.slot.since_ms.load(Ordering::Acquire)
        } else {
            self.now_ms()
        };
        // The others only: a sample that holds it and none older is no reason to refuse
        // it (with more than SAMPLE that owe, the oldest of a sample and it).
        let oldest = registry.least(
            Among::Owing,
            |id, s| {
                id != seat.id
                    && s.head_bytes.load(Ordering::Acquire) > 0
                    && s.close.load(Ordering::Acquire) == 0
                    && s.phase.load(Ordering::Acquire) != Phase::Busy as u8
            },
            |id, s| (s.since_ms.load(Ordering::Acquire), id),
        );
        match oldest {
            Some((key, place, slot)) if key < (mine, seat.id) => {
                slot.ask_to_close(Closed::HeadBudget);
                registry.owes_nothing(place);
                true
            }
            _ => false,
        }
    }

    fn count(&self, why: Closed) {
        self.closed[why as usize - 1].fetch_add(1, Ordering::Relaxed);
        self.trimmer.closed();
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// Whom the per-peer cap counts: an IPv4 address, or an IPv6 address's /64 (one host's
/// usual allocation: any address in it is the same client's to pick).
pub(super) fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(
                u128::from(v6) & !((1u128 << 64) - 1),
            )),
        },
    }
}

/// A connection's place in [`Connections`]: given back, with its head bytes, when dropped.
pub struct Seat {
    pub(super) connections: Arc<Connections>,
    id: u64,
    /// Its place in the registry's slots.
    place: usize,
    peer: Option<IpAddr>,
    slot: Arc<Slot>,
    /// The bytes of its unfinished head counted in the budget.
    head_bytes: usize,
    /// Why it ends: counted when dropped.
    closed: Closed,
}

impl Seat {
    pub(super) fn set_phase(&self, phase: Phase) {
        let was = self.slot.phase.swap(phase as u8, Ordering::AcqRel);
        if was != phase as u8 {
            self.slot
                .since_ms
                .store(self.connections.now_ms(), Ordering::Release);
            let owes = phase == Phase::Head;
            // In or out of what owes (a normal request goes from idle to busy in one read,
            // not through here; a fresh connection once, at its first request).
            if (was == Phase::Head as u8) != owes {
                let mut registry = self.connections.registry.lock();
                if owes {
                    registry.owes(self.place);
                } else {
                    registry.owes_nothing(self.place);
                }
            }
        }
    }

    /// What the registry asked of it, if anything.
    pub(super) fn asked_to_close(&self) -> Option<Closed> {
        Closed::from_u8(self.slot.close.load(Ordering::Acquire))
    }

    pub(super) fn wake_me(&self, waker: &Waker) {
        let mut slot = self.slot.waker.lock();
        if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *slot = Some(waker.clone());
        }
    }

    /// Count `len` bytes of its unfinished head (0 once complete): refused past the
    /// per-head cap or the budget of all heads.
    pub(super) fn hold_head(&mut self, len: usize) -> Result<(), Closed> {
        let limits = self.connections.limits;
        if len > limits.max_head_bytes {
            self.release_head();
            return Err(Closed::HeadTooLarge);
        }
        let budget = &self.connections.head_bytes;
        if len > self.head_bytes {
            let more = len - self.head_bytes;
            let before = budget.fetch_add(more, Ordering::AcqRel);
            self.set_head_bytes(len);
            if before + more > limits.head_budget && !self.connections.make_head_room(self) {
                self.release_head();
                return Err(Closed::HeadBudget);
            }
        } else {
            budget.fetch_sub(self.head_bytes - len, Ordering::AcqRel);
            self.set_head_bytes(len);
        }
        Ok(())
    }

    fn set_head_bytes(&mut self, len: usize) {
        self.head_bytes = len;
        self.slot.head_bytes.store(len, Ordering::Release);
    }

    pub(super) fn release_head(&mut self) {
        self.connections
            .head_bytes
            .fetch_sub(self.head_bytes, Ordering::AcqRel);
        self.set_head_bytes(0);
    }

    pub(super) fn ending(&mut self, why: Closed) {
        if self.closed == Closed::Done {
            self.closed = why;
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.release_head();
        let mut registry = self.connections.registry.lock();
        registry.owes_nothing(self.place);
        if let Some(place) = registry.slots.get_mut(self.place) {
            debug_assert!(matches!(place, Some((id, _)) if *id == self.id));
            *place = None;
            registry.free.push(self.place);
            registry.open -= 1;
        }
        if let Some(ip) = self.peer {
            if let Some(n) = registry.peers.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    registry.peers.remove(&ip);
                }
            }
        }
        drop(registry);
        self.connections.count(self.closed);
    }
}
