//! The limits on tokio's paused clock, over in-memory streams: the server's side is a
//! [`Guarded`] stream read and written as actix-http would.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::time::Instant;

use super::registry::{peer_key, SAMPLE};
use super::*;

const TIMEOUT: Duration = Duration::from_secs(2);
const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
const GET: &[u8] = b"GET /health/live HTTP/1.1\r\nHost: localhost\r\n\r\n";

fn limits() -> Limits {
    Limits {
        header_timeout: TIMEOUT,
        max_head_bytes: 1024,
        head_budget: 4096,
        max_connections: 3,
        per_peer: 0,
        answer_timeout: Duration::from_secs(20),
    }
}

fn peer(n: u8) -> Option<IpAddr> {
    Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)))
}

/// A connection: the client's end, and the server's guarded end.
fn connect(
    connections: &Arc<Connections>,
    from: Option<IpAddr>,
) -> (DuplexStream, Guarded<DuplexStream>) {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let seat = connections.admit(from).expect("admitted");
    (client, Guarded::new(server, seat))
}

/// The server reads one request head (and answers it), as actix-http would.
async fn serve_one(server: &mut Guarded<DuplexStream>) -> std::io::Result<()> {
    let mut buf = [0u8; 4096];
    let mut seen = Vec::new();
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = server.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        seen.extend_from_slice(&buf[..n]);
    }
    server.write_all(OK).await?;
    server.flush().await
}

async fn answer(client: &mut DuplexStream) -> String {
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(1), client.read(&mut buf))
        .await
        .map_or(0, |r| r.unwrap_or(0));
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// The phase the registry sees for its only connection.
fn only_phase(connections: &Connections) -> Phase {
    let open = connections.counts().open;
    let mine: Vec<_> = open.iter().filter(|(_, n)| *n == 1).collect();
    assert_eq!(mine.len(), 1, "{open:?}");
    mine[0].0
}

/// An unfinished head of `len` bytes.
fn partial_head(len: usize) -> Vec<u8> {
    let mut head = b"GET / HTTP/1.1\r\nX: ".to_vec();
    head.resize(len, b'a');
    head
}

// ---- The head deadline ----

#[tokio::test(start_paused = true)]
async fn a_head_trickled_on_a_reused_connection_is_cut_at_the_deadline_with_408() {
    let connections = Connections::new(limits());
    let (mut client, mut server) = connect(&connections, peer(1));
    client.write_all(GET).await.unwrap();
    serve_one(&mut server).await.unwrap();
    assert!(answer(&mut client).await.starts_with("HTTP/1.1 200"));
    // Idle for longer than the deadline: idle is not a head.
    tokio::time::sleep(TIMEOUT * 3).await;
    let served = tokio::spawn(async move { serve_one(&mut server).await });
    let started = Instant::now();
    // One byte a second: each would re-arm a keep-alive timer, never this deadline.
    for b in b"GET /health/live HTTP/1.1\r\nX: " {
        if client.write_all(&[*b]).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        if started.elapsed() > TIMEOUT * 2 {
            break;
        }
    }
    let error = served.await.unwrap().unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
    assert!(answer(&mut client).await.starts_with("HTTP/1.1 408"));
    assert!(started.elapsed() <= TIMEOUT + Duration::from_secs(1));
    tokio::time::sleep(Duration::from_millis(1)).await;
    let counts = connections.counts();
    assert!(
        counts.closed.contains(&(Closed::HeaderTimeout, 1)),
        "{counts:?}"
    );
    assert_eq!(counts.head_bytes, 0, "its bytes given back");
}

#[tokio::test(start_paused = true)]
async fn a_fresh_connection_that_sends_nothing_is_cut_at_the_deadline_from_the_accept() {
    let connections = Connections::new(limits());
    let (mut client, mut server) = connect(&connections, peer(1));
    let served = tokio::spawn(async move { serve_one(&mut server).await });
    let started = Instant::now();
    assert_eq!(
        served.await.unwrap().unwrap_err().kind(),
        std::io::ErrorKind::TimedOut
    );
    assert_eq!(started.elapsed(), TIMEOUT);
    assert!(answer(&mut client).await.starts_with("HTTP/1.1 408"));
}

#[tokio::test(start_paused = true)]
async fn a_body_arriving_slowly_is_not_a_head_and_has_no_head_deadline() {
    let connections = Connections::new(limits());
    let (mut client, mut server) = connect(&connections, peer(1));
    client
        .write_all(b"POST /v1 HTTP/1.1\r\nContent-Length: 10\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    assert!(server.read(&mut buf).await.unwrap() > 0);
    for _ in 0..5 {
        tokio::time::sleep(TIMEOUT).await;
        client.write_all(b"12").await.unwrap();
        assert_eq!(server.read(&mut buf).await.unwrap(), 2, "still served");
    }
    assert_eq!(connections.counts().open[2], (Phase::Busy, 1));
}

// ---- Head sizes: each head's cap and the budget of all heads ----

#[tokio::test(start_paused = true)]
async fn a_head_past_its_own_cap_or_past_the_budget_of_all_heads_is_refused_with_431() {
    let connections = Connections::new(limits());
    let (mut client, mut server) = connect(&connections, peer(1));
    let served = tokio::spawn(async move { serve_one(&mut server).await });
    let long = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(1100));
    client.write_all(long.as_bytes()).await.unwrap();
    let error = served.await.unwrap().unwrap_err();
    assert_eq!(error.to_string(), "head_too_large");
    assert!(answer(&mut client).await.starts_with("HTTP/1.1 431"));

    // Five unfinished heads of 900 bytes: the fifth passes the 4096 of all heads, and the
    // one arriving longest (the first) makes room for it.
    let connections = Connections::new(Limits {
        max_connections: 10,
        ..limits()
    });
    let mut held = Vec::new();
    let head = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(880));
    for _ in 0..5 {
        let (mut client, mut server) = connect(&connections, peer(1));
        client.write_all(head.as_bytes()).await.unwrap();
        let mut buf = [0u8; 2048];
        assert!(
            server.read(&mut buf).await.unwrap() > 0,
            "each head is taken"
        );
        held.push((client, server));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (mut first_client, mut first) = held.remove(0);
    let mut buf = [0u8; 64];
    assert_eq!(
        first.read(&mut buf).await.unwrap_err().to_string(),
        "head_budget"
    );
    assert!(answer(&mut first_client).await.starts_with("HTTP/1.1 431"));
    drop(first);
    assert_eq!(connections.counts().head_bytes, 4 * head.len() as u64);
    drop(held);
    assert_eq!(connections.counts().head_bytes, 0, "given back on close");
}

/// The limits are inclusive: a head of exactly `max_head_bytes` is taken, and heads that
/// fill the budget exactly are all kept; one byte more over the budget closes the oldest.
#[tokio::test(start_paused = true)]
async fn a_head_at_its_cap_and_heads_filling_the_budget_exactly_are_kept() {
    let connections = Connections::new(Limits {
        max_connections: 10,
        max_head_bytes: 1000,
        head_budget: 1000,
        ..limits()
    });
    let mut buf = [0u8; 2048];
    let (mut client, mut one) = connect(&connections, None);
    client.write_all(&partial_head(1000)).await.unwrap();
    assert!(
        one.read(&mut buf).await.is_ok(),
        "a head of exactly the cap"
    );
    drop((client, one));

    let (mut first_client, mut first) = connect(&connections, None);
    first_client.write_all(b"G").await.unwrap();
    assert!(first.read(&mut buf).await.is_ok());
    tokio::time::sleep(Duration::from_millis(10)).await;
    let (mut second_client, mut second) = connect(&connections, None);
    second_client.write_all(&partial_head(999)).await.unwrap();
    assert!(
        second.read(&mut buf).await.is_ok(),
        "1 + 999: the budget exactly"
    );
    assert_eq!(connections.counts().head_bytes, 1000);
    second_client.write_all(b"a").await.unwrap();
    assert!(
        second.read(&mut buf).await.is_ok(),
        "the newer head is kept"
    );
    assert_eq!(
        first.read(&mut buf).await.unwrap_err().to_string(),
        "head_budget",
        "1 + 1000: one byte over, the oldest makes room"
    );
}

/// Past the heads' budget the head arriving longest is closed: when that is the new
/// bytes' own connection, it is the one refused and the younger heads stay.
#[tokio::test(start_paused = true)]
async fn past_the_budget_the_oldest_head_is_refused_even_when_it_is_the_one_growing() {
    let connections = Connections::new(Limits {
        max_connections: 10,
        head_budget: 1000,
        ..limits()
    });
    let mut buf = [0u8; 2048];
    let (mut old_client, mut old) = connect(&connections, None);
    old_client.write_all(&partial_head(500)).await.unwrap();
    assert!(old.read(&mut buf).await.unwrap() > 0);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mut young_client, mut young) = connect(&connections, None);
    young_client.write_all(&partial_head(400)).await.unwrap();
    assert!(young.read(&mut buf).await.unwrap() > 0);
    old_client.write_all(&[b'a'; 300]).await.unwrap();
    assert_eq!(
        old.read(&mut buf).await.unwrap_err().to_string(),
        "head_budget",
        "the oldest head, growing past the budget, is refused"
    );
    young_client.write_all(b"\r\n\r\n").await.unwrap();
    assert!(
        young.read(&mut buf).await.unwrap() > 0,
        "the younger head was kept"
    );
}

/// Contract §1: past the budget of all heads the head arriving longest is closed, the new
/// one only if it is that head. Past [`SAMPLE`] places, a sample that held the new head and
/// missed the older one would refuse the new one (431) and keep the older (~1 in 4 here).
#[tokio::test(start_paused = true)]
async fn past_the_sample_a_new_head_is_not_refused_while_an_older_one_holds_the_budget() {
    let mut buf = [0u8; 2048];
    for round in 0..40 {
        let connections = Connections::new(Limits {
            max_connections: 1000,
            head_budget: 1000,
            ..limits()
        });
        let (mut old_client, mut old) = connect(&connections, None);
        old_client.write_all(&partial_head(900)).await.unwrap();
        assert!(old.read(&mut buf).await.unwrap() > 0);
        // SAMPLE - 1 fresh connections that have sent nothing: SAMPLE + 1 places.
        let others: Vec<_> = (1..SAMPLE)
            .map(|_| connections.admit(None).unwrap())
            .collect();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let (mut new_client, mut new) = connect(&connections, None);
        new_client.write_all(&partial_head(200)).await.unwrap();
        let read = new.read(&mut buf).await.map_err(|e| e.to_string());
        assert!(
            read.is_ok(),
            "round {round}: the new head was refused ({read:?}) while an older one held the budget"
        );
        assert_eq!(
            old.read(&mut buf).await.unwrap_err().to_string(),
            "head_budget"
        );
        drop(others);
    }
}

/// Contract §1, as above, with no sample at all: a pooled connection idle for 10 s whose
/// next head comes in two reads is not the head arriving longest (its idle time is no
/// arriving time); the head arriving for 1 s is.
#[tokio::test(start_paused = true)]
async fn a_reused_connection_head_counts_from_its_first_byte_not_from_going_idle() {
    let connections = Connections::new(Limits {
        max_connections: 10,
        head_budget: 1000,
        ..limits()
    });
    let mut buf = [0u8; 2048];
    let (mut pooled_client, mut pooled) = connect(&connections, None);
    pooled_client.write_all(GET).await.unwrap();
    serve_one(&mut pooled).await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (mut slow_client, mut slow) = connect(&connections, None);
    slow_client.write_all(&partial_head(900)).await.unwrap();
    assert!(slow.read(&mut buf).await.unwrap() > 0);
    tokio::time::sleep(Duration::from_secs(1)).await;
    pooled_client.write_all(&partial_head(200)).await.unwrap();
    let read = pooled.read(&mut buf).await.map_err(|e| e.to_string());
    assert!(
        read.is_ok(),
        "the pooled connection's new head was refused ({read:?}), the older head kept"
    );
    assert_eq!(
        slow.read(&mut buf).await.unwrap_err().to_string(),
        "head_budget"
    );
}

// ---- Past the connection limit: who makes room ----

#[tokio::test(start_paused = true)]
async fn past_the_limit_the_connection_idle_longest_makes_room_and_a_busy_one_never() {
    let connections = Connections::new(limits());
    // A: a request in progress (its body arriving). B: idle since t+1. C: idle since t+2.
    let (mut a_client, mut a) = connect(&connections, peer(1));
    a_client
        .write_all(b"POST /v1 HTTP/1.1\r\nContent-Length: 10\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    assert!(a.read(&mut buf).await.unwrap() > 0);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mut b_client, mut b) = connect(&connections, peer(2));
    b_client.write_all(GET).await.unwrap();
    serve_one(&mut b).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mut c_client, mut c) = connect(&connections, peer(3));
    c_client.write_all(GET).await.unwrap();
    serve_one(&mut c).await.unwrap();

    // D arrives: B, idle longest, is asked to close; A, oldest but busy, stays.
    let (_d_client, _d) = connect(&connections, peer(4));
    assert_eq!(b.read(&mut buf).await.unwrap_err().to_string(), "evicted");
    a_client.write_all(b"0123456789").await.unwrap();
    assert_eq!(a.read(&mut buf).await.unwrap(), 10, "A is served");
    drop(b);
    let _ = (b_client, c_client);
    assert!(connections.counts().closed.contains(&(Closed::Evicted, 1)));

    // All busy: a new one is refused.
    let busy = Connections::new(Limits {
        max_connections: 1,
        ..limits()
    });
    let (mut client, mut server) = connect(&busy, peer(1));
    client
        .write_all(b"POST /v1 HTTP/1.1\r\nContent-Length: 10\r\n\r\n")
        .await
        .unwrap();
    assert!(server.read(&mut buf).await.unwrap() > 0);
    assert_eq!(busy.admit(peer(2)).err(), Some(Closed::Full));
}

/// Past [`SAMPLE`] connections the choice looks at a random sample: it still closes one
/// that is not busy, and finds the only one that is not even when the sample misses it.
#[tokio::test(start_paused = true)]
async fn past_the_sample_a_connection_not_busy_is_still_found_to_make_room() {
    let n = SAMPLE * 5;
    let connections = Connections::new(Limits {
        max_connections: n,
        ..limits()
    });
    let mut held = Vec::new();
    let mut buf = [0u8; 256];
    for _ in 1..n {
        let (mut client, mut server) = connect(&connections, None);
        client
            .write_all(b"POST /v1 HTTP/1.1\r\nContent-Length: 10\r\n\r\n")
            .await
            .unwrap();
        assert!(server.read(&mut buf).await.unwrap() > 0);
        held.push((client, server));
    }
    let (mut idle_client, mut idle) = connect(&connections, None);
    idle_client.write_all(GET).await.unwrap();
    serve_one(&mut idle).await.unwrap();
    let (_new_client, _new) = connect(&connections, None);
    assert_eq!(
        idle.read(&mut buf).await.unwrap_err().to_string(),
        "evicted",
        "the one idle connection among {n} made room"
    );
}

/// Contract §1: one that owes something is closed before an idle one, past [`SAMPLE`]
/// connections too. Among 511 idle connections and the one fresh connection that owes its
/// head, a random sample of 64 misses the one that owes 88 % of the time, and a client's
/// pooled connection would be closed instead.
#[tokio::test(start_paused = true)]
async fn past_the_sample_one_that_owes_a_head_is_closed_before_an_idle_one() {
    let n = SAMPLE * 8;
    let connections = Connections::new(Limits {
        max_connections: n,
        ..limits()
    });
    let mut idle = Vec::new();
    for _ in 1..n {
        let (mut client, mut server) = connect(&connections, None);
        client.write_all(GET).await.unwrap();
        serve_one(&mut server).await.unwrap();
        idle.push((client, server));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mut _client, mut owing) = connect(&connections, None);
    let mut buf = [0u8; 64];
    for round in 0..10 {
        let (client, next) = connect(&connections, None);
        let asked = tokio::time::timeout(Duration::from_millis(10), owing.read(&mut buf)).await;
        assert_eq!(
            asked.map(|r| r.map_err(|e| e.to_string())).ok(),
            Some(Err("evicted".into())),
            "round {round}: an idle connection was closed while one owed its head"
        );
        drop(owing);
        (_client, owing) = (client, next);
    }
    assert!(connections.counts().closed.contains(&(Closed::Evicted, 10)));
}

/// Clients that send a request and never read the answer do not hold every seat. Such a
/// request stays "busy" (its answer is never written whole): no head deadline runs (the
/// stream polls one only in `poll_read`, and none while busy) and actix-http has no write
/// timeout; never evicted as well, such connections would have a new client refused `503`,
/// no token needed.
#[tokio::test(start_paused = true)]
async fn clients_that_never_read_their_answers_do_not_hold_every_seat() {
    let connections = Connections::new(limits());
    let mut clients = Vec::new();
    for n in 1..=3 {
        // A socket whose buffers fill: the answer is larger than the pipe holds.
        let (mut client, server) = tokio::io::duplex(256);
        let mut server = Guarded::new(server, connections.admit(peer(n)).unwrap());
        client.write_all(GET).await.unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            let mut seen = Vec::new();
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match server.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            let mut big = b"HTTP/1.1 200 OK\r\ncontent-length: 8192\r\n\r\n".to_vec();
            big.resize(big.len() + 8192, b'x');
            let _ = server.write_all(&big).await;
        });
        clients.push(client); // never read
    }
    tokio::time::sleep(TIMEOUT * 5).await;
    assert!(
        connections.admit(peer(9)).is_ok(),
        "three clients that read nothing hold every seat past the deadline: {:?}",
        connections.counts().open
    );
}

/// The same desync as framing's, through the guard: 100 pipelined `HEAD`s read at once
/// and answered leave the connection evictable, not busy, once every answer is written.
#[tokio::test(start_paused = true)]
async fn pipelined_heads_answered_leave_the_connection_evictable() {
    let connections = Connections::new(limits());
    let (mut client, mut server) = connect(&connections, peer(1));
    client
        .write_all(&b"HEAD /health/live HTTP/1.1\r\nHost: x\r\n\r\n".repeat(100))
        .await
        .unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0;
    while got < 100 * 39 {
        got += server.read(&mut buf).await.unwrap();
    }
    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 15\r\n\r\n";
    let reader = tokio::spawn(async move {
        let mut sink = vec![0u8; 64 * 1024];
        while client.read(&mut sink).await.is_ok_and(|n| n > 0) {}
    });
    for _ in 0..100 {
        server.write_all(answer).await.unwrap();
    }
    server.flush().await.unwrap();
    tokio::time::sleep(TIMEOUT).await;
    let busy = connections
        .counts()
        .open
        .iter()
        .find(|(p, _)| *p == Phase::Busy)
        .map(|(_, n)| *n);
    assert_eq!(busy, Some(0), "every request was answered");
    drop(reader);
}

// ---- A request is busy until its answer is written whole ----

/// actix-http writes `100 Continue` and calls `poll_flush` on every poll, written or not:
/// once the body is in, the request is taken for answered while its handler still runs.
#[tokio::test(start_paused = true)]
async fn after_100_continue_the_request_stays_busy_until_its_answer() {
    let connections = Connections::new(limits());
    let (mut client, mut server) = connect(&connections, peer(1));
    client
        .write_all(
            b"POST /v1 HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
        )
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    assert!(server.read(&mut buf).await.unwrap() > 0);
    server
        .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
        .await
        .unwrap();
    server.flush().await.unwrap();
    client.write_all(b"{}").await.unwrap();
    assert_eq!(server.read(&mut buf).await.unwrap(), 2);
    // The dispatcher's next poll: nothing to write, a flush all the same.
    server.flush().await.unwrap();
    assert_eq!(
        only_phase(&connections),
        Phase::Busy,
        "the handler has not answered"
    );
}

/// Two requests pipelined in one read: the first answer's flush must not end the second.
#[tokio::test(start_paused = true)]
async fn a_pipelined_request_stays_busy_after_the_previous_answer() {
    let connections = Connections::new(limits());
    let (mut client, mut server) = connect(&connections, peer(1));
    client.write_all(&[GET, GET].concat()).await.unwrap();
    let mut buf = [0u8; 256];
    assert_eq!(server.read(&mut buf).await.unwrap(), 2 * GET.len());
    server.write_all(OK).await.unwrap();
    server.flush().await.unwrap();
    assert_eq!(
        only_phase(&connections),
        Phase::Busy,
        "the second is not answered"
    );
}

/// actix-http serves `Upgrade: h2c` (not websocket) as a plain request and keeps the
/// connection; the framing turns opaque and every later head goes untimed and uncounted.
#[tokio::test(start_paused = true)]
async fn a_non_websocket_upgrade_header_does_not_end_the_framing() {
    let mut f = framing::Framing::default();
    f.feed(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\n\r\n");
    f.feed(b"GET / HTTP/1.1\r\nX: ");
    assert!(!f.is_opaque());
    assert_eq!(f.head_len(), 19, "the next head is a head");
}

// ---- Per peer ----

#[tokio::test(start_paused = true)]
async fn one_peer_gets_at_most_its_cap_and_its_room_back_when_one_closes() {
    let connections = Connections::new(Limits {
        max_connections: 100,
        per_peer: 2,
        ..limits()
    });
    let first = connections.admit(peer(1)).unwrap();
    let _second = connections.admit(peer(1)).unwrap();
    assert_eq!(connections.admit(peer(1)).err(), Some(Closed::PeerLimit));
    assert!(
        connections.admit(peer(2)).is_ok(),
        "another peer is not held back"
    );
    drop(first);
    assert!(connections.admit(peer(1)).is_ok());
    assert!(connections
        .counts()
        .closed
        .contains(&(Closed::PeerLimit, 1)));
}

/// The per-peer cap counts an IPv6 /64 as one peer, an IPv4-mapped address as its IPv4.
#[test]
fn a_peer_is_an_ipv4_address_or_an_ipv6_slash_64() {
    let v6 = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(peer_key(v6("2001:db8:1:2::1")), v6("2001:db8:1:2::"));
    assert_eq!(
        peer_key(v6("2001:db8:1:2:ffff:ffff:ffff:ffff")),
        v6("2001:db8:1:2::")
    );
    assert_ne!(peer_key(v6("2001:db8:1:3::1")), v6("2001:db8:1:2::"));
    assert_eq!(peer_key(v6("::ffff:10.0.0.1")), v6("10.0.0.1"));
    assert_eq!(peer_key(v6("10.0.0.1")), v6("10.0.0.1"));
}

// ---- What /metrics shows ----

/// `/metrics`'s labels are the contract's words (§1, "Connections").
#[test]
fn the_phases_and_close_reasons_are_labelled_as_the_contract_names_them() {
    let phases: Vec<_> = Phase::ALL.iter().map(|p| p.as_str()).collect();
    assert_eq!(phases, ["idle", "head", "busy"]);
    let reasons: Vec<_> = Closed::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "done",
            "header_timeout",
            "head_too_large",
            "head_budget",
            "evicted",
            "peer_limit",
            "full",
            "stalled"
        ]
    );
}
