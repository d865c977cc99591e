//! Null sink: an HTTP/1.1 server that reads every request body, discards it and answers
//! `200 {}`. It is the benchmark baseline for the HTTP side: the same load generator drives
//! it and the collector in the same run, so the collector's figures can be quoted as a
//! fraction of what the machine's loopback HTTP path can carry at all.
//!
//! Built on the same stack as the collector (hyper 1 on a 2-worker tokio runtime, one task
//! per keep-alive connection, `TCP_NODELAY`), so the difference between the two is the
//! collector's own work: parsing, routing, the spool and its `fdatasync`.
//!
//! ```text
//! rhc-null-sink --listen 127.0.0.1:0     # prints "listening on 127.0.0.1:PORT"
//! ```

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

/// Reads and discards request bodies, answers 200 `{}`.
#[derive(Parser, Debug)]
#[command(name = "rhc-null-sink")]
struct Args {
    /// Address to listen on; port 0 picks a free port (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:8085")]
    listen: SocketAddr,
    /// Tokio worker threads (the collector uses 2).
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Collect each body into one buffer before answering, as the collector does (default:
    /// drop each frame as it arrives).
    #[arg(long)]
    collect: bool,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    bytes: AtomicU64,
}

async fn handle(
    req: Request<Incoming>,
    counters: Arc<Counters>,
    collect: bool,
) -> Response<Full<Bytes>> {
    let mut body = req.into_body();
    let mut n = 0u64;
    let ok = if collect {
        match body.collect().await {
            Ok(c) => {
                n = c.to_bytes().len() as u64;
                true
            }
            Err(_) => false,
        }
    } else {
        loop {
            match body.frame().await {
                None => break true,
                Some(Ok(f)) => {
                    if let Some(d) = f.data_ref() {
                        n += d.len() as u64;
                    }
                }
                Some(Err(_)) => break false,
            }
        }
    };
    counters.requests.fetch_add(1, Ordering::Relaxed);
    counters.bytes.fetch_add(n, Ordering::Relaxed);
    let mut r = Response::new(Full::new(Bytes::from_static(b"{}")));
    if !ok {
        *r.status_mut() = StatusCode::BAD_REQUEST;
    }
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.workers.max(1))
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(args.listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("rhc-null-sink: cannot listen on {}: {e}", args.listen);
                std::process::exit(1);
            }
        };
        let local = listener.local_addr().expect("local address");
        println!("listening on {local}");
        let _ = std::io::stdout().flush();
        let counters = Arc::new(Counters::default());
        {
            // One summary line on SIGTERM/SIGINT, then exit.
            let counters = counters.clone();
            tokio::spawn(async move {
                use tokio::signal::unix::{signal, SignalKind};
                let (Ok(mut term), Ok(mut int)) = (
                    signal(SignalKind::terminate()),
                    signal(SignalKind::interrupt()),
                ) else {
                    return;
                };
                tokio::select! {
                    _ = term.recv() => {},
                    _ = int.recv() => {},
                }
                eprintln!(
                    "rhc-null-sink: {} requests, {} body bytes",
                    counters.requests.load(Ordering::Relaxed),
                    counters.bytes.load(Ordering::Relaxed)
                );
                std::process::exit(0);
            });
        }
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(c) => c,
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let counters = counters.clone();
            let collect = args.collect;
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let counters = counters.clone();
                    async move { Ok::<_, Infallible>(handle(req, counters, collect).await) }
                });
                let _ = http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
}
