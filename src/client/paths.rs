//! The path operations (`stat`, `list`, `mkdir`, `remove`, `rename`) on
//! the same client: what a program walking, making and moving files
//! needs, each answered under the session's policy.

use super::{Client, ClientError};
use airlock_core::fsproxy::wire::{Op, PathRequest, Success};
use serde_json::{Map, Value};

/// What `stat` tells of a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Last modification, in nanoseconds since the epoch (0 for a
    /// virtual file).
    pub mtime_ns: i64,
}

/// One entry of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub kind: String,
    pub size: u64,
}

/// One page of a listing, and the `after` of the next when more follow.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListPage {
    pub entries: Vec<Entry>,
    pub next: Option<String>,
}

fn bad(what: &str, m: &Map<String, Value>) -> ClientError {
    ClientError::BadResponse(format!("{what} answered {}", Value::Object(m.clone())))
}

impl Client {
    fn path_call(&mut self, req: PathRequest) -> Result<Map<String, Value>, ClientError> {
        match self.call(Op::Path { req, scope: None })? {
            Success::Value(m) => Ok(m),
            other => Err(ClientError::BadResponse(format!("path op answered {other:?}"))),
        }
    }

    /// `stat`: what `path` is, following a symlink there unless `follow`
    /// is false.
    pub fn stat(&mut self, path: &str, follow: bool) -> Result<Stat, ClientError> {
        let m = self.path_call(PathRequest::Stat { path: path.to_owned(), follow })?;
        let kind = m.get("kind").and_then(Value::as_str).ok_or_else(|| bad("stat", &m))?.to_owned();
        Ok(Stat {
            kind,
            size: m.get("size").and_then(Value::as_u64).unwrap_or(0),
            mode: m.get("mode").and_then(Value::as_u64).and_then(|v| u32::try_from(v).ok()).unwrap_or(0),
            mtime_ns: m.get("mtime_ns").and_then(Value::as_i64).unwrap_or(0),
        })
    }

    /// One page of the listing of directory `path`: entries whose names
    /// sort after `after`, at most `max` (the session may give fewer).
    pub fn list_page(
        &mut self,
        path: &str,
        after: Option<&str>,
        max: Option<u32>,
    ) -> Result<ListPage, ClientError> {
        let req = PathRequest::List { path: path.to_owned(), after: after.map(str::to_owned), max };
        let m = self.path_call(req)?;
        let entries = m.get("entries").and_then(Value::as_array).ok_or_else(|| bad("list", &m))?;
        let mut page = ListPage::default();
        for e in entries {
            let name = e.get("name").and_then(Value::as_str).ok_or_else(|| bad("list", &m))?;
            page.entries.push(Entry {
                name: name.to_owned(),
                kind: e.get("kind").and_then(Value::as_str).unwrap_or("other").to_owned(),
                size: e.get("size").and_then(Value::as_u64).unwrap_or(0),
            });
        }
        page.next = m.get("next").and_then(Value::as_str).map(str::to_owned);
        // A cursor that does not move on would page forever.
        if page.next.is_some() && (page.entries.is_empty() || page.next.as_deref() <= after) {
            return Err(bad("list (a cursor that does not move on)", &m));
        }
        Ok(page)
    }

    /// Every entry of directory `path`, page by page, each handed to
    /// `each` as it comes.
    pub fn list(&mut self, path: &str, mut each: impl FnMut(&Entry)) -> Result<u64, ClientError> {
        let mut after: Option<String> = None;
        let mut n = 0u64;
        loop {
            let page = self.list_page(path, after.as_deref(), None)?;
            for e in &page.entries {
                each(e);
            }
            n += page.entries.len() as u64;
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(n),
            }
        }
    }

    /// `mkdir`; `parents`: make the missing directories on the way too,
    /// and take one already there as made (`mkdir -p`).
    pub fn mkdir(&mut self, path: &str, parents: bool) -> Result<(), ClientError> {
        self.path_call(PathRequest::Mkdir { path: path.to_owned(), parents }).map(drop)
    }

    /// `remove`: a file, a symlink (not what it leads to) or an empty
    /// directory.
    pub fn remove(&mut self, path: &str) -> Result<(), ClientError> {
        self.path_call(PathRequest::Remove { path: path.to_owned() }).map(drop)
    }

    /// `rename`; `noreplace`: fail rather than replace what is at `to`.
    pub fn rename(&mut self, from: &str, to: &str, noreplace: bool) -> Result<(), ClientError> {
        let req = PathRequest::Rename { from: from.to_owned(), to: to.to_owned(), noreplace };
        self.path_call(req).map(drop)
    }
}
