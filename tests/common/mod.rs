//! Shared harness for integration tests: an in-process mock engine, a raw TCP server that
//! answers with scripted bytes (for malformed and interrupted streams), and flag parsing.

#![allow(dead_code)]

use servetune::bench::args::BenchArgs;
use servetune::bench::{self, BenchOutcome};
use servetune::mock::{self, MockConfig, MockHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Parses `servetune bench` flags.
pub fn args(flags: &[&str]) -> BenchArgs {
    let mut v = vec!["--disable-tqdm"];
    v.extend_from_slice(flags);
    BenchArgs::from_flags(&v).expect("valid flags")
}

pub async fn start_mock(cfg: MockConfig) -> MockHandle {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    mock::serve(l, cfg).unwrap()
}

/// Runs a benchmark against `base` with the given extra flags.
pub async fn bench_at(base: &str, flags: &[&str]) -> BenchOutcome {
    let mut v = vec!["--base-url", base, "--tokenizer", "words"];
    v.extend_from_slice(flags);
    let (plan, _info) = args(&v).prepare().await.expect("prepare");
    bench::run(plan).await.expect("run")
}

/// A server that reads one request per connection and answers with `response` bytes verbatim,
/// then closes. Good for malformed streams, missing content and connections cut mid-stream.
pub async fn scripted_server(response: &'static [u8]) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                break;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let mut seen = Vec::new();
                // Read until the end of the headers and the body (Content-Length).
                loop {
                    let n = match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    seen.extend_from_slice(&buf[..n]);
                    if let Some(h) = find(&seen, b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&seen[..h]).to_lowercase();
                        let len = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if seen.len() >= h + 4 + len {
                            break;
                        }
                    }
                }
                let _ = s.write_all(response).await;
                let _ = s.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

/// Live (non-zombie) mock engines whose command line contains `marker`.
pub fn engines_with(marker: &str) -> Vec<String> {
    let mut left = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let p = e.path();
        let Ok(cmd) = std::fs::read(p.join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        let zombie = std::fs::read_to_string(p.join("stat"))
            .ok()
            .and_then(|s| {
                s.rsplit(')')
                    .next()
                    .map(|r| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(true);
        if !zombie && cmd.contains("mock-engine") && cmd.contains(marker) {
            left.push(cmd);
        }
    }
    left
}
