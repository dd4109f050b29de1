//! A local OTLP/HTTP sink for bench comparison 13: answers every POST `200` with an empty
//! protobuf body after reading it whole (keep-alive, a thread per connection), and counts
//! the requests and bytes it took (printed on stderr every 10 s). It decodes nothing: the
//! measure is the gateway's cost of exporting, not a collector's.
//!
//!   otlpsink ADDR MAX_SECS

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:4318".into());
    let max_secs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1800);
    let listener = TcpListener::bind(&addr).expect("bind");
    let requests = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    {
        let (requests, bytes) = (Arc::clone(&requests), Arc::clone(&bytes));
        std::thread::spawn(move || {
            let started = Instant::now();
            loop {
                std::thread::sleep(Duration::from_secs(10));
                eprintln!(
                    "otlpsink: {} requests, {} bytes",
                    requests.load(Ordering::Relaxed),
                    bytes.load(Ordering::Relaxed)
                );
                if started.elapsed() > Duration::from_secs(max_secs) {
                    std::process::exit(0);
                }
            }
        });
    }
    for stream in listener.incoming().flatten() {
        let (requests, bytes) = (Arc::clone(&requests), Arc::clone(&bytes));
        std::thread::spawn(move || {
            let _ = serve(stream, &requests, &bytes);
        });
    }
}

fn serve(stream: TcpStream, requests: &AtomicU64, bytes: &AtomicU64) -> std::io::Result<()> {
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body)?;
        requests.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(length as u64, Ordering::Relaxed);
        writer.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
        )?;
    }
}
