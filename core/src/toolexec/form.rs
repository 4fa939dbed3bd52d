//! The request body: `application/x-www-form-urlencoded`, decoded byte for
//! byte (no lossy UTF-8, no NUL).

use percent_encoding::percent_decode;
use std::fmt;

/// A decoded `/exec` form: `tool` once, `cwd` at most once, `arg`
/// repeated in order. Unknown keys are ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecForm {
    pub tool: Vec<u8>,
    pub cwd: Option<Vec<u8>>,
    pub args: Vec<Vec<u8>>,
}

/// Why a body is not a usable form (400).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FormError {
    /// `%` not followed by two hex digits, at this byte offset.
    BadEscape(usize),
    /// A key or value decodes to bytes holding NUL (argv cannot carry it).
    Nul,
    MissingTool,
    RepeatedTool,
    RepeatedCwd,
}

impl fmt::Display for FormError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormError::BadEscape(at) => write!(f, "bad percent escape at byte {at}"),
            FormError::Nul => f.write_str("NUL byte in a field"),
            FormError::MissingTool => f.write_str("field 'tool' missing"),
            FormError::RepeatedTool => f.write_str("field 'tool' repeated"),
            FormError::RepeatedCwd => f.write_str("field 'cwd' repeated"),
        }
    }
}

impl std::error::Error for FormError {}

fn decode(part: &[u8], offset: usize) -> Result<Vec<u8>, FormError> {
    // percent_decode passes a malformed escape through literally; a shim
    // never sends one, so it is a client bug worth a 400, not a guess.
    for (i, &b) in part.iter().enumerate() {
        if b == b'%' {
            let ok = part.get(i + 1..i + 3).is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit));
            if !ok {
                return Err(FormError::BadEscape(offset + i));
            }
        }
    }
    let plus_as_space: Vec<u8> = part.iter().map(|&b| if b == b'+' { b' ' } else { b }).collect();
    let out: Vec<u8> = percent_decode(&plus_as_space).collect();
    if out.contains(&0) {
        return Err(FormError::Nul);
    }
    Ok(out)
}

/// Decode an `/exec` body.
pub fn decode_form(body: &[u8]) -> Result<ExecForm, FormError> {
    let mut tool = None;
    let mut cwd = None;
    let mut args = Vec::new();
    let mut offset = 0;
    for pair in body.split(|&b| b == b'&') {
        let start = offset;
        offset += pair.len() + 1;
        if pair.is_empty() {
            continue;
        }
        let (k, v, v_start) = match pair.iter().position(|&b| b == b'=') {
            Some(eq) => (&pair[..eq], &pair[eq + 1..], start + eq + 1),
            // An empty value has no byte an error could name.
            None => (pair, &pair[pair.len()..], start),
        };
        let key = decode(k, start)?;
        let value = decode(v, v_start)?;
        match key.as_slice() {
            b"tool" if tool.is_some() => return Err(FormError::RepeatedTool),
            b"tool" => tool = Some(value),
            b"cwd" if cwd.is_some() => return Err(FormError::RepeatedCwd),
            b"cwd" => cwd = Some(value),
            b"arg" => args.push(value),
            _ => {}
        }
    }
    let tool = tool.ok_or(FormError::MissingTool)?;
    Ok(ExecForm { tool, cwd, args })
}

/// Resolve `cwd` lexically against the working directory: relative paths
/// join it, `.` and `..` fold, and the result must stay under it. Symlinks
/// are the shell's to check (it reports [`super::SpawnError::BadCwd`]).
pub(super) fn resolve_cwd(workdir: &[u8], cwd: Option<&[u8]>) -> Result<Vec<u8>, &'static str> {
    let Some(cwd) = cwd else { return Ok(workdir.to_vec()) };
    if cwd.is_empty() {
        return Err("cwd is empty");
    }
    let root: Vec<&[u8]> = workdir.split(|&b| b == b'/').filter(|c| !c.is_empty()).collect();
    let mut parts: Vec<&[u8]> = if cwd.first() == Some(&b'/') { Vec::new() } else { root.clone() };
    for c in cwd.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                if parts.pop().is_none() {
                    return Err("cwd escapes the root");
                }
            }
            c => parts.push(c),
        }
    }
    if parts.len() < root.len() || parts[..root.len()] != root[..] {
        return Err("cwd is outside the working directory");
    }
    let mut out = Vec::with_capacity(workdir.len() + cwd.len());
    for p in &parts {
        out.push(b'/');
        out.extend_from_slice(p);
    }
    if out.is_empty() {
        out.push(b'/');
    }
    Ok(out)
}
