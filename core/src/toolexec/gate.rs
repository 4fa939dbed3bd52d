//! The connection cap: the shell takes a permit before `accept`, so extra
//! clients wait in the listen backlog instead of being accepted and idled.

/// Connections served at once, against `--max-connections`.
#[derive(Clone, Debug)]
pub struct Gate {
    max: usize,
    open: usize,
}

impl Gate {
    pub fn new(max: usize) -> Self {
        Gate { max: max.max(1), open: 0 }
    }

    /// May the shell call `accept` now?
    pub fn may_accept(&self) -> bool {
        self.open < self.max
    }

    /// Take a permit; `false` (and nothing taken) when the cap is reached.
    pub fn try_take(&mut self) -> bool {
        if self.may_accept() {
            self.open += 1;
            true
        } else {
            false
        }
    }

    /// A connection ended (or an accept failed): its permit comes back.
    pub fn release(&mut self) {
        self.open = self.open.saturating_sub(1);
    }

    pub fn open(&self) -> usize {
        self.open
    }

    pub fn max(&self) -> usize {
        self.max
    }
}
