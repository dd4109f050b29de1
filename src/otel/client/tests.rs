//! The retry loop over each transport, against real collectors on 127.0.0.1: an HTTP one
//! that answers as told, and the collector's generated gRPC trace service on tonic.

mod http {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use std::time::Duration;

    use reqwest::header::HeaderMap;
    use tokio::time::Instant;

    use super::super::Poster;

    /// A collector on 127.0.0.1 that answers its `n`th request with `answers[n]` (the last
    /// one again past the end), after reading it whole; it counts the requests.
    async fn collector(answers: &'static [&'static str]) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let url = format!("http://{}/v1/traces", listener.local_addr().expect("bound"));
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&seen);
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let head_end = loop {
                            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                break i + 4;
                            }
                            let mut chunk = [0u8; 4096];
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        };
                        let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        while buf.len() < head_end + length {
                            let mut chunk = [0u8; 4096];
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        buf.drain(..head_end + length);
                        let n = counter.fetch_add(1, Ordering::SeqCst);
                        let answer = answers[n.min(answers.len() - 1)];
                        let reply = format!("HTTP/1.1 {answer}\r\ncontent-length: 0\r\n\r\n");
                        if stream.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, seen)
    }

    fn poster(url: String) -> Poster {
        crate::tls::install_ring();
        Poster::http(reqwest::Client::new(), url, HeaderMap::new())
    }

    #[tokio::test]
    async fn a_busy_collector_is_asked_again_and_its_retry_after_waited() {
        let (url, seen) = collector(&[
            "503 Service Unavailable\r\nretry-after: 1",
            "429 Too Many Requests",
            "200 OK",
        ])
        .await;
        let started = Instant::now();
        let posted = poster(url)
            .post(vec![1, 2, 3], Duration::from_secs(10))
            .await;
        assert_eq!(posted, Ok(Vec::new()));
        assert_eq!(seen.load(Ordering::SeqCst), 3);
        assert!(
            started.elapsed() >= Duration::from_secs(1),
            "the Retry-After was waited: {:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_refusal_is_final_and_retries_end_at_the_deadline() {
        let (url, seen) = collector(&["400 Bad Request"]).await;
        let posted = poster(url).post(vec![1], Duration::from_secs(10)).await;
        assert_eq!(posted, Err("the collector answered 400 Bad Request".into()));
        assert_eq!(seen.load(Ordering::SeqCst), 1, "a 400 is not sent again");

        // Always busy: at most 3 retries, never past the deadline.
        let (url, seen) = collector(&["502 Bad Gateway"]).await;
        let started = Instant::now();
        let posted = poster(url.clone())
            .post(vec![1], Duration::from_secs(10))
            .await;
        assert!(posted.is_err_and(|e| e.contains("502") && e.contains("3 retries")));
        assert_eq!(seen.load(Ordering::SeqCst), 4);
        // The backoffs, 100, 200 and 400 ms, each with its jitter added.
        assert!(
            started.elapsed() >= Duration::from_millis(700),
            "backed off: {:?}",
            started.elapsed()
        );
        let (url, seen) = collector(&["503 Service Unavailable\r\nretry-after: 30"]).await;
        let started = Instant::now();
        let posted = poster(url).post(vec![1], Duration::from_secs(2)).await;
        assert!(posted.is_err_and(|e| e.contains("no time left")));
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn a_failed_request_says_why() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let url = format!("http://{}/v1/traces", listener.local_addr().expect("bound"));
        drop(listener);
        let error = poster(url)
            .post(vec![1], Duration::from_millis(300))
            .await
            .expect_err("nobody listens");
        assert!(
            error.to_lowercase().contains("connection refused"),
            "the cause, not only \"error sending request\": {error}"
        );
    }

    #[tokio::test]
    async fn a_collector_that_is_not_there_yet_is_tried_again() {
        // A port with nobody on it, then a collector on it.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let address = listener.local_addr().expect("bound");
        drop(listener);
        let url = format!("http://{address}/v1/traces");
        let late = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let listener = TcpListener::bind(address).await.expect("the same port");
            let (mut stream, _) = listener.accept().await.expect("a request");
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .await;
        });
        let posted = poster(url).post(vec![1], Duration::from_secs(5)).await;
        assert_eq!(posted, Ok(Vec::new()));
        late.await.expect("served");
    }
}

mod grpc {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
    };
    use prost::Message as _;
    use tokio::time::Instant;
    use tonic_types::{ErrorDetails, StatusExt as _};

    use std::time::Duration;

    use reqwest::header::HeaderMap;
    use tonic::{Code, Status};

    use super::super::{Poster, Signal};

    /// The collector's answer to its `n`th call.
    type Script = fn(usize) -> Result<ExportTraceServiceResponse, Status>;

    struct Scripted {
        calls: Arc<AtomicUsize>,
        script: Script,
        spans: Arc<AtomicUsize>,
    }

    #[tonic::async_trait]
    impl TraceService for Scripted {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, Status> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            let spans = request.into_inner().resource_spans.len();
            self.spans.fetch_add(spans, Ordering::SeqCst);
            (self.script)(n).map(tonic::Response::new)
        }
    }

    /// A real gRPC trace collector (the generated server on tonic) on 127.0.0.1: its URL,
    /// its calls, and the resource spans it decoded.
    async fn collector(script: Script) -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let url = format!("http://{}", listener.local_addr().expect("bound"));
        let calls = Arc::new(AtomicUsize::new(0));
        let spans = Arc::new(AtomicUsize::new(0));
        let server = TraceServiceServer::new(Scripted {
            calls: Arc::clone(&calls),
            script,
            spans: Arc::clone(&spans),
        });
        tokio::spawn(tonic::transport::Server::builder().serve_with_incoming(
            server,
            tonic::transport::server::TcpIncoming::from(listener),
        ));
        (url, calls, spans)
    }

    fn poster(url: &str) -> Poster {
        crate::tls::install_ring();
        Poster::grpc(
            url,
            HeaderMap::new(),
            Signal::Traces,
            Duration::from_secs(5),
        )
        .expect("a gRPC endpoint")
    }

    /// An `ExportTraceServiceRequest` with one (empty) resource's spans.
    fn one_resource() -> Vec<u8> {
        ExportTraceServiceRequest {
            resource_spans: vec![Default::default()],
        }
        .encode_to_vec()
    }

    #[tokio::test]
    async fn an_unavailable_collector_is_called_again_and_its_answer_read() {
        let (url, calls, spans) = collector(|n| match n {
            0 | 1 => Err(Status::unavailable("starting")),
            _ => Ok(ExportTraceServiceResponse {
                partial_success: Some(ExportTracePartialSuccess {
                    rejected_spans: 3,
                    error_message: "too old".into(),
                }),
            }),
        })
        .await;
        let answer = poster(&url)
            .post(one_resource(), Duration::from_secs(10))
            .await
            .expect("answered on the third call");
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert_eq!(
            spans.load(Ordering::SeqCst),
            3,
            "each call carried the message"
        );
        let partial = ExportTraceServiceResponse::decode(answer.as_slice())
            .expect("the collector's response, as it sent it")
            .partial_success
            .expect("a partial success");
        assert_eq!(partial.rejected_spans, 3);
    }

    #[tokio::test]
    async fn a_refusal_is_final_and_resource_exhausted_waits_only_when_told_how_long() {
        let (url, calls, _) = collector(|_| Err(Status::invalid_argument("bad"))).await;
        let error = poster(&url)
            .post(one_resource(), Duration::from_secs(10))
            .await
            .expect_err("refused");
        assert!(
            error.contains("InvalidArgument") && error.contains("bad"),
            "{error}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1, "not sent again");

        let (url, calls, _) = collector(|_| Err(Status::resource_exhausted("full"))).await;
        let error = poster(&url)
            .post(one_resource(), Duration::from_secs(10))
            .await
            .expect_err("exhausted");
        assert!(error.contains("ResourceExhausted"), "{error}");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "no RetryInfo: final");

        let (url, calls, _) = collector(|n| match n {
            0 => Err(Status::with_error_details(
                Code::ResourceExhausted,
                "full",
                ErrorDetails::with_retry_info(Some(Duration::from_millis(400))),
            )),
            _ => Ok(ExportTraceServiceResponse::default()),
        })
        .await;
        let started = Instant::now();
        poster(&url)
            .post(one_resource(), Duration::from_secs(10))
            .await
            .expect("answered after the delay it asked for");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert!(
            started.elapsed() >= Duration::from_millis(400),
            "the RetryInfo's delay was waited: {:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn an_https_endpoint_is_tls_and_a_plain_text_collector_fails_its_handshake() {
        let (url, calls, _) = collector(|_| Ok(ExportTraceServiceResponse::default())).await;
        let url = url.replace("http://", "https://");
        let error = poster(&url)
            .post(one_resource(), Duration::from_millis(500))
            .await
            .expect_err("no TLS on the other side");
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "no call got through: {error}"
        );
        // rustls's words for a plain-text answer to its ClientHello.
        assert!(
            error.contains("InvalidContentType"),
            "the cause is the TLS handshake: {error}"
        );
        assert_eq!(
            error.matches("InvalidContentType").count(),
            1,
            "said once: {error}"
        );
    }

    #[tokio::test]
    async fn an_answer_too_long_to_read_is_an_export_taken_not_one_sent_again() {
        // A partial success past the bound read: the collector took the export; sending
        // it again would only duplicate it (over HTTP such an answer is not read either).
        let (url, calls, _) = collector(|_| {
            Ok(ExportTraceServiceResponse {
                partial_success: Some(ExportTracePartialSuccess {
                    rejected_spans: 1,
                    error_message: "x".repeat(2 * crate::otel::client::attempt::MAX_ANSWER),
                }),
            })
        })
        .await;
        let answer = poster(&url)
            .post(one_resource(), Duration::from_secs(10))
            .await;
        assert_eq!(answer, Ok(Vec::new()), "taken, its answer not read");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "not sent again");

        // An answer of the bound's length is read whole.
        let (url, _, _) =
            collector(|_| Ok(answer_of(crate::otel::client::attempt::MAX_ANSWER))).await;
        let answer = poster(&url)
            .post(one_resource(), Duration::from_secs(10))
            .await
            .expect("answered");
        assert_eq!(answer.len(), crate::otel::client::attempt::MAX_ANSWER);

        // A collector's long rejection (48 KiB of why) is still read: the bound is 64 KiB.
        let (url, _, _) = collector(|_| Ok(answer_of(48 * 1024))).await;
        let answer = poster(&url)
            .post(one_resource(), Duration::from_secs(10))
            .await
            .expect("answered");
        assert_eq!(answer.len(), 48 * 1024, "read whole");
    }

    /// A partial success whose encoding is `len` bytes long.
    fn answer_of(len: usize) -> ExportTraceServiceResponse {
        let mut message = len;
        loop {
            let answer = ExportTraceServiceResponse {
                partial_success: Some(ExportTracePartialSuccess {
                    rejected_spans: 1,
                    error_message: "x".repeat(message),
                }),
            };
            match answer.encoded_len() {
                n if n == len => return answer,
                n if n > len => message -= n - len,
                n => message += len - n,
            }
        }
    }

    #[tokio::test]
    async fn a_connection_gone_silent_is_left_for_a_new_one() {
        // The collector behind a port whose first connection is taken and never read nor
        // answered (a peer gone without a word: a dropped flow, a dead host); the next
        // connections reach the collector.
        let (target, calls, _) = collector(|_| Ok(ExportTraceServiceResponse::default())).await;
        let target = target.trim_start_matches("http://").to_owned();
        let front = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let url = format!("http://{}", front.local_addr().expect("bound"));
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&connections);
        tokio::spawn(async move {
            let mut silent = Vec::new();
            while let Ok((mut stream, _)) = front.accept().await {
                if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                    silent.push(stream);
                    continue;
                }
                let target = target.clone();
                tokio::spawn(async move {
                    if let Ok(mut collector) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut stream, &mut collector).await;
                    }
                });
            }
        });
        let poster = poster(&url);
        let error = poster
            .post(one_resource(), Duration::from_millis(300))
            .await
            .expect_err("nothing answers on the first connection");
        assert!(error.contains("did not answer"), "{error}");
        let answer = poster.post(one_resource(), Duration::from_secs(5)).await;
        assert_eq!(
            answer,
            Ok(Vec::new()),
            "the next export on a new connection"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(connections.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_collector_not_there_says_why_and_is_not_waited_past_the_deadline() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let url = format!("http://{}", listener.local_addr().expect("bound"));
        drop(listener);
        let started = Instant::now();
        let error = poster(&url)
            .post(one_resource(), Duration::from_millis(500))
            .await
            .expect_err("nobody listens");
        assert!(
            error.to_lowercase().contains("connection refused"),
            "the cause: {error}"
        );
        assert!(error.contains("retries"), "unavailable is retried: {error}");
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
