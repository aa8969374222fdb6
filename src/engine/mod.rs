//! Engines: the only module that spawns processes. For now it owns the process primitive that
//! every launch goes through (own process group, argv vector, teardown that leaves nothing
//! behind); the engine adapters and the readiness ladder build on it. `slots` divides the node
//! among parallel trials; the placement it hands out is applied at spawn.

pub mod failure;
pub mod inventory;
pub mod launch;
pub mod process;
pub mod reap;
pub mod slots;
pub mod trial;
