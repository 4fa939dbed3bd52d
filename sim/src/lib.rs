//! Deterministic simulator (see issue: the simulator).
