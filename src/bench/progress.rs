//! Live progress of a run: a one-line bar redrawn in place on a terminal, a plain line every few
//! seconds otherwise (logs, CI). Counters are atomics updated by the collector.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
pub struct Counters {
    pub done: AtomicU64,
    pub failed: AtomicU64,
    pub output_tokens: AtomicU64,
    pub finished: AtomicBool,
}

/// Draws progress to stderr until `counters.finished` is set. Returns the drawing task.
pub fn spawn(
    counters: Arc<Counters>,
    total: u64,
    label: String,
    enabled: bool,
) -> Option<tokio::task::JoinHandle<()>> {
    if !enabled {
        return None;
    }
    let tty = std::io::stderr().is_terminal();
    Some(tokio::spawn(async move {
        let start = Instant::now();
        let period = if tty {
            Duration::from_millis(250)
        } else {
            Duration::from_secs(5)
        };
        loop {
            let finished = counters.finished.load(Ordering::Relaxed);
            if !finished {
                tokio::time::sleep(period).await;
            }
            let el = start.elapsed().as_secs_f64().max(1e-9);
            let done = counters.done.load(Ordering::Relaxed);
            let failed = counters.failed.load(Ordering::Relaxed);
            let tok = counters.output_tokens.load(Ordering::Relaxed);
            let frac = if total > 0 {
                done as f64 / total as f64
            } else {
                1.0
            };
            let width = 24;
            let filled = ((frac * width as f64) as usize).min(width);
            let line = format!(
                "{label} [{}{}] {done}/{total} {:5.1} req/s {:8.1} tok/s errors {failed} {:5.1}s",
                "#".repeat(filled),
                ".".repeat(width - filled),
                done as f64 / el,
                tok as f64 / el,
                el
            );
            let mut err = std::io::stderr().lock();
            if tty {
                let _ = write!(err, "\r\x1b[2K{line}");
                if finished {
                    let _ = writeln!(err);
                }
            } else {
                let _ = writeln!(err, "{line}");
            }
            let _ = err.flush();
            if finished {
                break;
            }
        }
    }))
}
