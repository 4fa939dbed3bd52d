//! The FS-proxy world's checkers that need a settled world (handles held
//! at every level, file contents against the clients' models) and those
//! that end a run.

use super::{at, violation, Check, Class, Loc, World, MIDDLE_CONN};
use std::path::PathBuf;

impl World {
    /// Nothing left to do but shut down: the middle exits once its clients
    /// are gone; then the world is finished.
    pub(super) fn shutdown_step(&mut self) -> Check {
        if self.clients.iter().any(|c| !c.gone) {
            return Err(violation(
                "liveness",
                "clients still wait for responses but nothing is in flight".to_owned(),
            ));
        }
        if self.nested && self.levels[1].alive {
            let m = &self.levels[1].m;
            if m.open_handles() != 0 || m.tracked_clients() != 0 {
                return Err(at(
                    violation(
                        "no_leaked_handles",
                        format!(
                            "intermediate holds {} handles for {} clients after all left",
                            m.open_handles(),
                            m.tracked_clients()
                        ),
                    ),
                    1,
                    MIDDLE_CONN,
                ));
            }
            self.kill_middle(false);
            return self.first_violation.take().map_or(Ok(()), Err);
        }
        for (i, l) in self.levels.iter().enumerate() {
            if l.alive && (l.m.open_handles() != 0 || l.m.tracked_clients() != 0) {
                return Err(violation(
                    "no_leaked_handles",
                    format!(
                        "level {i} ends the run with {} handles and {} clients",
                        l.m.open_handles(),
                        l.m.tracked_clients()
                    ),
                ));
            }
        }
        if self.fs.open_count() != 0 {
            return Err(violation(
                "no_leaked_handles",
                format!("{} host files still open at the end", self.fs.open_count()),
            ));
        }
        self.broker_final_check()?;
        self.pager_final_check()?;
        if self.fs.get(&PathBuf::from("/data/ro/a.txt")) != Some(self.fixture.as_slice()) {
            return Err(violation("policy", "a read-only file changed".to_owned()));
        }
        self.finished = true;
        Ok(())
    }

    pub(super) fn quiescent(&self) -> bool {
        self.broker
            .as_ref()
            .is_none_or(|b| b.provider_idle() && self.levels[0].m.broker().is_some_and(|x| x.is_idle()))
            && self.effects.is_empty()
            && self.clients.iter().all(|c| c.gone || c.out.is_empty())
            && self.link.as_ref().is_none_or(|l| l.up.is_empty() && l.down.is_empty() && !l.down_eof)
    }

    /// The checks that need a settled world; the others run as outputs are
    /// routed.
    pub(super) fn check(&mut self) -> Check {
        self.broker_check()?;
        self.check_bounds()?;
        self.check_heap()?;
        self.pager_check()?;
        if !self.quiescent() {
            return Ok(());
        }
        for c in &self.clients {
            if !c.gone && (!c.order.is_empty() || c.null_expected > 0) {
                // The first five by id, as they were named when a map
                // sorted by id held them.
                let mut ids: Vec<&String> = c.order.iter().map(|(q, _)| &q.id).collect();
                ids.sort_unstable();
                ids.truncate(5);
                return Err(at(
                    violation(
                        "liveness",
                        format!(
                            "world is quiet but {} requests are unanswered (ids {ids:?}, {} without id)",
                            c.order.len(),
                            c.null_expected
                        ),
                    ),
                    c.level,
                    c.id,
                ));
            }
        }
        self.check_handles()?;
        self.check_files()
    }

    pub(super) fn check_handles(&mut self) -> Check {
        for &(level, client) in &self.departed_check {
            let l = &self.levels[level];
            if l.alive && l.m.handles_of(client) != 0 {
                return Err(at(
                    violation(
                        "no_leaked_handles",
                        format!(
                            "departed client still owns {} handles on level {level}",
                            l.m.handles_of(client)
                        ),
                    ),
                    level,
                    client,
                ));
            }
        }
        self.departed_check.clear();
        let middle_up = self.nested && self.levels[1].alive && !self.gone.contains(&(0, MIDDLE_CONN));
        let mut middle_total = 0;
        let mut host_open = 0;
        let mut totals = vec![0usize; self.levels.len()];
        for c in self.clients.iter().filter(|c| !c.gone) {
            let l = &self.levels[c.level];
            if !l.alive {
                continue;
            }
            let n = c.handles.len();
            if l.m.handles_of(c.id) != n {
                return Err(at(
                    violation(
                        "no_leaked_handles",
                        format!("machine says {} handles, client holds {n}", l.m.handles_of(c.id)),
                    ),
                    c.level,
                    c.id,
                ));
            }
            totals[c.level] += n;
            let hosts = c.handles.values().filter(|h| h.host).count();
            if c.level == 1 {
                // Only host files are held at the top: the intermediate's
                // virtual files are its own.
                middle_total += hosts;
                if middle_up {
                    host_open += hosts;
                }
            } else {
                host_open += hosts;
            }
        }
        if middle_up {
            totals[0] += middle_total;
            let at_top = self.levels[0].m.handles_of(MIDDLE_CONN);
            if at_top != middle_total {
                return Err(at(
                    violation(
                        "no_leaked_handles",
                        format!("top holds {at_top} handles for the intermediate, whose clients hold {middle_total}"),
                    ),
                    0,
                    MIDDLE_CONN,
                ));
            }
        }
        for (i, l) in self.levels.iter().enumerate() {
            if l.alive && l.m.open_handles() != totals[i] {
                return Err(violation(
                    "no_leaked_handles",
                    format!("level {i} holds {} handles, live clients {}", l.m.open_handles(), totals[i]),
                ));
            }
        }
        if self.fs.open_count() != host_open {
            return Err(violation(
                "no_leaked_handles",
                format!("{} host files open, live clients hold {host_open}", self.fs.open_count()),
            ));
        }
        Ok(())
    }

    pub(super) fn check_files(&mut self) -> Check {
        let dirty = self.fs.take_dirty();
        for p in dirty {
            if let Some(mut f) = p.to_str().and_then(|k| self.files.get_mut(k)) {
                f.dirty = true;
            }
        }
        let levels = &self.levels;
        let fs = &self.fs;
        self.files.for_each_mut(
            |f| f.dirty,
            |key, f| {
                f.dirty = false;
                let actual = match &f.loc {
                    Loc::Host(p) => fs.get(p),
                    Loc::Virtual(name, level) => levels[*level].m.virtual_file(name),
                };
                match f.class {
                    Class::Private if !f.unknown => {
                        let is = |exists: bool, content: &[u8]| {
                            if exists {
                                actual == Some(content)
                            } else {
                                actual.is_none()
                            }
                        };
                        if !is(f.exists, &f.content) && !f.alt.as_ref().is_some_and(|(e, c)| is(*e, c)) {
                            return Err(violation(
                                "no_data_loss",
                                format!(
                                    "{key}: holds {:?} bytes, acknowledged requests leave {} bytes{}",
                                    actual.map(<[u8]>::len),
                                    f.content.len(),
                                    f.alt
                                        .as_ref()
                                        .map_or(String::new(), |(_, c)| format!(" (or {})", c.len()))
                                ),
                            ));
                        }
                    }
                    Class::Log => {
                        f.log
                            .check(actual.unwrap_or_default())
                            .map_err(|m| violation("no_data_loss", format!("{key}: {m}")))?;
                    }
                    _ => {}
                }
                Ok(())
            },
        )
    }

    /// At the end of a seed: each log's kept check gives the verdict of a
    /// check from the start of the file.
    pub(super) fn check_logs_agree(&self) -> Check {
        for (key, f) in self.files.iter() {
            if let (Class::Log, Loc::Host(p)) = (f.class, &f.loc) {
                let data = self.fs.get(p).unwrap_or_default();
                f.log.agrees(data).map_err(|m| violation("checker_counts", format!("{key}: {m}")))?;
            }
        }
        Ok(())
    }
}
