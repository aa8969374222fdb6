//! The mock engine in profile mode: the scheduler of `sim` driven by the wall clock. One task
//! owns the scheduler; requests submit through a channel and receive their tokens as each step
//! ends (step k ends at the sum of the first k step durations, an absolute schedule). A client
//! that goes away cancels its sequence; a prefill larger than the run-time memory allows kills
//! the engine with the engine's out-of-memory message, as a real one dies mid-benchmark.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::sim::{Sched, Submit};

/// What a request hears from the engine.
#[derive(Debug)]
pub enum Event {
    Tokens {
        n: u64,
        done: bool,
    },
    /// Refused: the prompt exceeds the context available to it.
    TooLong {
        prompt: u64,
        limit: u64,
    },
}

enum Cmd {
    Submit(Submit, mpsc::UnboundedSender<Event>),
    Cancel(u64),
}

/// Gauges for /metrics (kv usage in millionths).
#[derive(Debug, Default)]
pub struct Gauges {
    pub running: AtomicU64,
    pub waiting: AtomicU64,
    pub kv_usage_ppm: AtomicU64,
    pub preemptions: AtomicU64,
    pub prefix_hit_tokens: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generated: AtomicU64,
}

#[derive(Clone)]
pub struct Engine {
    tx: mpsc::UnboundedSender<Cmd>,
    pub gauges: Arc<Gauges>,
    next_id: Arc<AtomicU64>,
    pub block_size: usize,
}

/// Cancels the sequence when the request's stream is dropped.
pub struct Ticket {
    pub id: u64,
    tx: mpsc::UnboundedSender<Cmd>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let _ = self.tx.send(Cmd::Cancel(self.id));
    }
}

impl Engine {
    /// Starts the engine task. `on_oom(prefill_tokens)` is called (once) when a step prefills
    /// more than `oom_prefill_tokens`; the engine stops then.
    pub fn start(
        mut sched: Sched,
        oom_prefill_tokens: Option<u64>,
        on_oom: impl FnOnce(u64) + Send + 'static,
    ) -> Engine {
        let (tx, mut rx) = mpsc::unbounded_channel::<Cmd>();
        let gauges = Arc::new(Gauges::default());
        let g = gauges.clone();
        let block_size = sched.settings.block_size.max(1) as usize;
        tokio::spawn(async move {
            let mut senders: HashMap<u64, mpsc::UnboundedSender<Event>> = HashMap::new();
            let mut clock = tokio::time::Instant::now();
            let apply =
                |cmd: Cmd,
                 sched: &mut Sched,
                 senders: &mut HashMap<u64, mpsc::UnboundedSender<Event>>| {
                    match cmd {
                        Cmd::Submit(s, tx) => {
                            senders.insert(s.id, tx);
                            sched.submit(s);
                        }
                        Cmd::Cancel(id) => {
                            senders.remove(&id);
                            sched.cancel(id);
                        }
                    }
                };
            loop {
                while let Ok(cmd) = rx.try_recv() {
                    apply(cmd, &mut sched, &mut senders);
                }
                if sched.idle() {
                    g.running.store(0, Ordering::Relaxed);
                    g.waiting.store(0, Ordering::Relaxed);
                    g.kv_usage_ppm.store(0, Ordering::Relaxed);
                    match rx.recv().await {
                        Some(cmd) => apply(cmd, &mut sched, &mut senders),
                        None => return,
                    }
                    clock = tokio::time::Instant::now();
                    continue;
                }
                let step = sched.step();
                if oom_prefill_tokens.is_some_and(|l| step.prefill_tokens > l) {
                    on_oom(step.prefill_tokens);
                    return;
                }
                clock += Duration::from_secs_f64(step.duration_s);
                let now = tokio::time::Instant::now();
                if clock + Duration::from_millis(50) < now {
                    // Fell behind (a stalled runtime): do not burst to catch up.
                    clock = now;
                }
                tokio::time::sleep_until(clock).await;
                for r in step.refused {
                    if let Some(tx) = senders.remove(&r.id) {
                        let _ = tx.send(Event::TooLong {
                            prompt: r.prompt_tokens,
                            limit: r.limit,
                        });
                    }
                }
                for e in step.emits {
                    g.generated.fetch_add(e.tokens, Ordering::Relaxed);
                    let gone = match senders.get(&e.id) {
                        Some(tx) => tx
                            .send(Event::Tokens {
                                n: e.tokens,
                                done: e.done,
                            })
                            .is_err(),
                        None => false,
                    };
                    if e.done || gone {
                        senders.remove(&e.id);
                    }
                }
                g.running.store(sched.running() as u64, Ordering::Relaxed);
                g.waiting.store(sched.waiting() as u64, Ordering::Relaxed);
                g.kv_usage_ppm
                    .store((sched.kv_usage() * 1e6) as u64, Ordering::Relaxed);
                g.preemptions
                    .store(sched.stats.preemptions, Ordering::Relaxed);
                g.prefix_hit_tokens
                    .store(sched.stats.prefix_hit_tokens, Ordering::Relaxed);
                g.prompt_tokens
                    .store(sched.stats.prompt_tokens, Ordering::Relaxed);
            }
        });
        Engine {
            tx,
            gauges,
            next_id: Arc::new(AtomicU64::new(0)),
            block_size,
        }
    }

    /// Queues a request; its events arrive on the receiver. Dropping the ticket cancels it.
    pub fn submit(
        &self,
        prompt_tokens: u64,
        max_tokens: u64,
        blocks: Vec<u64>,
    ) -> (Ticket, mpsc::UnboundedReceiver<Event>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = self.tx.send(Cmd::Submit(
            Submit {
                id,
                prompt_tokens,
                max_tokens,
                blocks,
            },
            tx,
        ));
        (
            Ticket {
                id,
                tx: self.tx.clone(),
            },
            rx,
        )
    }
}
