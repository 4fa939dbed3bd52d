//! Invariants 11 and 12 (DESIGN.md), checked after every step: what a
//! machine holds for a client and for the session stays under its bounds,
//! and no frame answers a response. Every amount is recomputed from what
//! the world itself sent and saw — frames delivered and not yet answered,
//! virtual files it created, connections it holds — never read from the
//! machine's own accounting.

use super::files::VirtualUse;
use super::response::{Id, Response};
use super::{at, violation, Check, World, MIDDLE_CONN};
use airlock_core::codec::frame::HEADER_LEN;
use airlock_core::fsproxy::ATTACHED_CLIENT_BASE;
use airlock_core::handles::ClientId;

impl World {
    /// A descriptor the machine refused: it is closed, never attached.
    pub(super) fn on_drop_descriptor(&mut self, level: usize, client: ClientId) -> Check {
        let i = self.client_at(level, client).filter(|&i| self.clients[i].fds_unclaimed > 0).ok_or_else(
            || at(violation("descriptors", "dropped a descriptor never passed".into()), level, client),
        )?;
        self.clients[i].fds_unclaimed -= 1;
        Ok(())
    }

    /// Invariant 12: a response the client sent (`floods::self_loop`) is
    /// never answered.
    pub(super) fn check_not_answering_echo(&self, i: usize, v: &Response) -> Check {
        let c = &self.clients[i];
        match v.id() {
            Id::Str(id) if c.floods.echoes.contains(id.as_ref()) => Err(violation(
                "no_answer_to_response",
                format!("the response {id} the client sent was answered: {v}"),
            )),
            _ => Ok(()),
        }
    }

    /// Invariant 11, every step.
    pub(super) fn check_bounds(&mut self) -> Check {
        let b = self.swarm.bounds;
        let levels = self.levels.len();
        for level in 0..levels {
            if !self.levels[level].alive {
                continue;
            }
            let mut session_queued = 0u64;
            let mut buffered = 0u64;
            let mut attached = 0usize;
            let mut descriptors = 0u64;
            let max_frame = self.swarm.max_frame as u64;
            for c in self.clients.iter_mut().filter(|c| c.level == level && !c.gone) {
                let taken = c.out.taken;
                let queued = c.order.queued_bytes(taken);
                if queued > b.max_queued_bytes {
                    return Err(at(
                        violation(
                            "bounded_queue_bytes",
                            format!(
                                "{queued} bytes of requests wait, over the bound of {}",
                                b.max_queued_bytes
                            ),
                        ),
                        level,
                        c.id,
                    ));
                }
                session_queued += queued;
                // A partial frame: bytes delivered past the last whole one.
                let partial =
                    c.floods.partial.map_or_else(|| c.out.partial(), |start| taken.saturating_sub(start));
                if partial > max_frame + HEADER_LEN as u64 {
                    return Err(at(
                        violation("bounded_buffer", format!("{partial} bytes of one partial frame held")),
                        level,
                        c.id,
                    ));
                }
                buffered += partial;
                if c.id.0 >= ATTACHED_CLIENT_BASE {
                    attached += 1;
                }
                descriptors += 1 + c.fds_unclaimed;
            }
            buffered += self.link_partial(level);
            if session_queued > b.max_session_queued_bytes {
                return Err(at(
                    violation(
                        "bounded_session_queue_bytes",
                        format!(
                            "{session_queued} bytes of requests wait in all, over the bound of {}",
                            b.max_session_queued_bytes
                        ),
                    ),
                    level,
                    MIDDLE_CONN,
                ));
            }
            // The partial frames of every live connection together; one
            // delivery may cross the bound, and the machine then ends the
            // connection that crossed it, so the bound holds between steps.
            if buffered > b.max_buffered_bytes {
                return Err(violation(
                    "bounded_buffer",
                    format!(
                        "level {level} holds {buffered} partial-frame bytes, over {}",
                        b.max_buffered_bytes
                    ),
                ));
            }
            // Descriptors the shell would hold for this level: a connection
            // per live client (the intermediate's, at the top), the sockets
            // passed and not yet claimed, the host files open.
            if level == 0 && self.nested && !self.gone.contains(&(0, MIDDLE_CONN)) {
                descriptors += 1;
            }
            if level == self.store {
                descriptors += self.fs.open_count() as u64;
            }
            // The broker runs at the top level: each provider call in
            // flight holds a connection to the provider.
            if level == 0 {
                descriptors += self.broker.as_ref().map_or(0, |br| br.connections_held());
            }
            if descriptors > b.max_descriptors as u64 {
                return Err(violation(
                    "bounded_descriptors",
                    format!("level {level} holds {descriptors} descriptors, over {}", b.max_descriptors),
                ));
            }
            // Every attach is refused once `max_clients` are served, so the
            // attached ones alone can never be more.
            if attached > b.max_clients {
                return Err(violation(
                    "bounded_clients",
                    format!("level {level} serves {attached} attached clients, over {}", b.max_clients),
                ));
            }
        }
        self.check_virtual_bounds()
    }

    /// What the bounds checks keep between steps against a full recount:
    /// after every step in debug builds (every test), and at the end of
    /// every seed. A difference is a bug of the checker, which would
    /// otherwise pass or fail worlds it should not.
    pub(super) fn check_kept_counts(&self) -> Check {
        self.files
            .check_counts(self.levels.len())
            .map_err(|m| violation("checker_counts", format!("virtual files: {m}")))?;
        for c in &self.clients {
            c.order.check_kept().map_err(|m| at(violation("checker_counts", m), c.level, c.id))?;
            c.handles.check_count().map_err(|m| at(violation("checker_counts", m), c.level, c.id))?;
        }
        Ok(())
    }

    /// The virtual files the world knows exist: their names' bytes (and
    /// the contents it models) and their number stay under the bounds.
    fn check_virtual_bounds(&self) -> Check {
        // Each level's virtual files are its own, under its own bounds.
        for level in 0..self.levels.len() {
            self.check_virtual_bounds_of(level)?;
        }
        Ok(())
    }

    fn check_virtual_bounds_of(&self, level: usize) -> Check {
        let b = self.swarm.bounds;
        let VirtualUse { bytes, files } = self.files.virtual_use(level);
        if bytes > b.max_virtual_bytes {
            return Err(violation(
                "bounded_virtual_bytes",
                format!(
                    "virtual files hold at least {bytes} bytes, names included, over {}",
                    b.max_virtual_bytes
                ),
            ));
        }
        if files > b.max_virtual_files {
            return Err(violation(
                "bounded_virtual_files",
                format!("at least {files} virtual files exist, over {}", b.max_virtual_files),
            ));
        }
        Ok(())
    }

    /// The partial frame the top holds of the middle's connection: one of
    /// the connections `max_buffered_bytes` bounds together.
    fn link_partial(&self, level: usize) -> u64 {
        match &self.link {
            Some(link) if level == 0 && !self.gone.contains(&(0, MIDDLE_CONN)) => link.up.partial(),
            _ => 0,
        }
    }

    /// The machine may end a connection holding a partial frame (one
    /// error, id null) only when the partial frames of all connections
    /// cross `max_buffered_bytes`, by the world's own count.
    pub(super) fn buffered_closure(&self, i: usize, v: &Response) -> Result<bool, super::Violation> {
        let message = v.message();
        if !message.contains("--max-buffered-bytes") {
            return Ok(false);
        }
        let level = self.clients[i].level;
        let total: u64 = self
            .clients
            .iter()
            .filter(|c| c.level == level && !c.gone)
            .map(|c| c.floods.partial.map_or_else(|| c.out.partial(), |s| c.out.taken.saturating_sub(s)))
            .sum::<u64>()
            + self.link_partial(level);
        if total <= self.swarm.bounds.max_buffered_bytes {
            return Err(violation(
                "bounded_buffer",
                format!("a connection was ended for partial frames of {total} bytes in all: {v}"),
            ));
        }
        Ok(true)
    }

    /// Item 11: while the top still serves the intermediate, the
    /// intermediate never loses its upstream (an oversized answer fails at
    /// most the one request it answers).
    pub(super) fn check_link_kept(&self, i: usize, v: &Response) -> Check {
        let c = &self.clients[i];
        if c.level != 1 || self.gone.contains(&(0, MIDDLE_CONN)) {
            return Ok(());
        }
        let message = v.message();
        if message.contains("upstream closed") || message.contains("upstream sent a bad frame") {
            return Err(violation(
                "upstream_link_kept",
                format!("the intermediate lost its upstream while the top still serves it: {v}"),
            ));
        }
        Ok(())
    }
}
