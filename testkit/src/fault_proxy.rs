//! A real TCP proxy for fault tests: it sits between sendgate and a real server and,
//! while connections are live, can pass traffic, black-hole it (accept and hold the
//! bytes, forwarding nothing until told to pass again, like a network partition that TCP
//! later recovers from), delay every chunk, or reset every connection (RST).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Pass,
    /// Hold every byte: nothing is forwarded, nothing is closed.
    Blackhole,
    /// Forward each chunk after this long.
    Delay(Duration),
    /// Reset every live connection, and every new one at once.
    Reset,
}

pub struct FaultProxy {
    addr: SocketAddr,
    mode: watch::Sender<Fault>,
    /// Where new connections go: [`FaultProxy::retarget`] moves them (a failover).
    target: watch::Sender<SocketAddr>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Listen on 127.0.0.1 (a random port) and forward to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy binds");
        let addr = listener.local_addr().unwrap();
        let (mode, _) = watch::channel(Fault::Pass);
        let (target, targets) = watch::channel(target);
        let modes = mode.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let modes = modes.subscribe();
                tokio::spawn(relay(client, *targets.borrow(), modes));
            }
        });
        Self {
            addr,
            mode,
            target,
            task,
        }
    }

    /// Send new connections to `target` and reset the live ones, as a failover behind one
    /// address does (a DNS name or a virtual IP moved to the promoted server).
    pub async fn retarget(&self, target: SocketAddr) {
        self.target.send_replace(target);
        let was = self.mode.send_replace(Fault::Reset);
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.mode.send_replace(was);
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn set(&self, fault: Fault) {
        self.mode.send_replace(fault);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.mode.send_replace(Fault::Reset);
        self.task.abort();
    }
}

async fn relay(client: TcpStream, target: SocketAddr, mut modes: watch::Receiver<Fault>) {
    if *modes.borrow() == Fault::Reset {
        return reset(client);
    }
    let upstream = tokio::select! {
        connected = TcpStream::connect(target) => match connected {
            Ok(s) => s,
            Err(_) => return reset(client),
        },
        _ = until_reset(&mut modes) => return reset(client),
    };
    // Linger 0: when the proxy closes a socket it resets it, as a crashed peer would.
    for s in [&client, &upstream] {
        let _ = s.set_nodelay(true);
        #[allow(deprecated)]
        let _ = s.set_linger(Some(Duration::ZERO));
    }
    let (client_read, client_write) = client.into_split();
    let (upstream_read, upstream_write) = upstream.into_split();
    let there = tokio::spawn(pipe(client_read, upstream_write, modes.clone()));
    let back = tokio::spawn(pipe(upstream_read, client_write, modes.clone()));
    let (abort_there, abort_back) = (there.abort_handle(), back.abort_handle());
    tokio::select! {
        _ = until_reset(&mut modes) => {
            abort_there.abort();
            abort_back.abort();
        }
        _ = async { let _ = tokio::join!(there, back); } => {}
    }
}

/// Copy one direction under the current fault.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut modes: watch::Receiver<Fault>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        loop {
            let fault = *modes.borrow_and_update();
            match fault {
                Fault::Pass => break,
                Fault::Delay(d) => {
                    tokio::time::sleep(d).await;
                    break;
                }
                Fault::Blackhole => {
                    if modes.changed().await.is_err() {
                        return;
                    }
                }
                Fault::Reset => return,
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn until_reset(modes: &mut watch::Receiver<Fault>) {
    let _ = modes.wait_for(|m| *m == Fault::Reset).await;
}

/// Close with RST rather than FIN: linger 0, then drop.
#[allow(deprecated)]
fn reset(stream: TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
    drop(stream);
}
