//! The hot requests (`open`, `read`, `write`, `close`) read straight from
//! the frame's bytes into typed fields: no `Value` tree, no tokenizer, no
//! copy of a write's base64. The pager's ops (`FD_*`) keep their params as
//! a map, which `pager::wire` checks; a flat one of plain members is read
//! here too. It answers only the plain case: anything else (an escape in a
//! string, a number that is not a plain integer, an unknown, repeated or
//! mistyped field, a scope, any other op, anything nested) is `None` and
//! goes to [`super::parse_request_tree`], which
//! decides every case. So both paths give one answer for every frame
//! (property-tested), and this one can be strict without being thorough:
//! declining is always right.
//!
//! Written by hand rather than through serde_json's deserializer: a
//! request is a few short members, and the generic tokenizer's per-member
//! cost was most of what the machine spent on one.

use super::{Limits, Mode, Op, Rejection, Request};
use crate::b64;
use crate::codec::plain::{is_text, Cursor, Slot};
use crate::handles::Handle;
use crate::pager::wire::FdOp;
use serde_json::{Map, Value};

#[derive(Default)]
struct Hot<'a> {
    h: Slot<u64>,
    max: Slot<u64>,
    // Bytes: base64's alphabet is ASCII, so decoding checks what UTF-8
    // validation would.
    data: Slot<&'a [u8]>,
    fin: Slot<bool>,
    path: Slot<&'a str>,
    mode: Slot<&'a str>,
}

fn hot<'a>(c: &mut Cursor<'a>) -> Option<Hot<'a>> {
    let mut p = Hot::default();
    c.object(|c, key| match key {
        b"h" => c.member(&mut p.h, Cursor::uint),
        b"max" => c.member(&mut p.max, Cursor::uint),
        // Only the closing quote is looked for: in a write, an escape, a
        // control character or a byte that is not ASCII fails the decoding
        // (its alphabet is letters, digits, `+`, `/`, `=`); any other op
        // checks the bytes as text below.
        b"data" => c.member(&mut p.data, Cursor::raw_string),
        b"final" => c.member(&mut p.fin, |c| match c.peek()? {
            b't' => c.literal(b"true").map(|()| true),
            _ => c.literal(b"false").map(|()| false),
        }),
        b"path" => c.member(&mut p.path, Cursor::text),
        b"mode" => c.member(&mut p.mode, Cursor::text),
        // A scope, even `null`, and any other member: the tree's.
        _ => None,
    })?;
    Some(p)
}

/// An fd op's params as the tree reads them, when they are an object of
/// plain members: strings, non-negative integers, booleans and nulls, each
/// key once (the tree keeps a repeated key's last value; declined here).
fn flat(c: &mut Cursor<'_>) -> Option<Map<String, Value>> {
    let mut m = Map::new();
    c.object(|c, key| {
        let key = std::str::from_utf8(key).ok()?;
        let v = match c.peek()? {
            b'"' => Value::String(c.text()?.to_owned()),
            b't' => c.literal(b"true").map(|()| Value::Bool(true))?,
            b'f' => c.literal(b"false").map(|()| Value::Bool(false))?,
            b'n' => c.literal(b"null").map(|()| Value::Null)?,
            _ => Value::from(c.uint()?),
        };
        m.insert(key.to_owned(), v).is_none().then_some(())
    })?;
    Some(m)
}

/// The params as the op named before them reads them.
enum Params<'a> {
    Hot(Hot<'a>),
    Fd(Map<String, Value>),
}

pub(super) fn parse(payload: &[u8], limits: Limits) -> Option<Result<Request, Rejection>> {
    let mut c = Cursor::new(payload);
    let (mut id, mut op, mut ps): (Slot<&str>, Slot<&[u8]>, Slot<Params<'_>>) = (None, None, None);
    c.ws();
    c.object(|c, key| match key {
        b"id" => c.member(&mut id, Cursor::text),
        b"op" => {
            c.member(&mut op, Cursor::string)?;
            // Any other op is the tree's: stop here, before its params.
            matches!(
                op,
                Some(Some(
                    b"read"
                        | b"write"
                        | b"close"
                        | b"open"
                        | b"FD_WRAP"
                        | b"FD_READ"
                        | b"FD_SEARCH"
                        | b"FD_TO_FILE"
                ))
            )
            .then_some(())
        }
        // An fd op's params are read as such only once the op is known.
        b"params" => match op {
            Some(Some(name)) if name.starts_with(b"FD_") => c.member(&mut ps, |c| flat(c).map(Params::Fd)),
            _ => c.member(&mut ps, |c| hot(c).map(Params::Hot)),
        },
        _ => None,
    })?;
    if !c.at_end() {
        return None;
    }
    // `id` and `op` must be there and not null; `params` here must be an
    // object, since every op this path takes needs one of its fields.
    let (Some(Some(id)), Some(Some(op)), Some(Some(p))) = (id, op, ps) else { return None };
    let p = match p {
        Params::Hot(p) => p,
        Params::Fd(params) => {
            let op = FdOp::parse(std::str::from_utf8(op).ok()?)?;
            return Some(Ok(Request { id: id.to_owned(), op: Op::Fd { op, params } }));
        }
    };
    // A `data` member the op does not decode is still part of the JSON
    // the tree would read (or refuse).
    if op != b"write" && p.data.flatten().is_some_and(|d| !is_text(d)) {
        return None;
    }
    let op = match op {
        b"read" => {
            let (h, max) = (p.h??, p.max??);
            if max == 0 || max > u64::from(limits.max_read) {
                return None;
            }
            Op::Read { h: Handle::new(h), max: max as u32 }
        }
        b"write" => Op::Write { h: Handle::new(p.h??), data: b64::decode(p.data??).ok()? },
        b"close" => Op::Close { h: Handle::new(p.h??) },
        b"open" => Op::Open { path: p.path??.to_owned(), mode: Mode::parse(p.mode??)?, scope: None },
        _ => return None,
    };
    // `final` only has to be a boolean or null, which `params` checked.
    let _ = p.fin;
    Some(Ok(Request { id: id.to_owned(), op }))
}
