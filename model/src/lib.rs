//! loom models of the shell's concurrency primitives.
