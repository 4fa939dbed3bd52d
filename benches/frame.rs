//! What airlock's decoding costs on top of parsing JSON at all.
//!
//! For each payload the baseline is a bare `serde_json::from_slice` into a
//! `Value`; the airlock side is what one request costs the FS proxy on the
//! wire: frame decoding, request (or upstream response) validation, and
//! encoding and framing the answer, each the way the machine does it. A last group times the whole machine,
//! bytes in to framed response out, for a 4096-byte virtual-file read.

use airlock_core::codec::frame::{self, FrameDecoder, DEFAULT_MAX_FRAME};
use airlock_core::fsproxy::wire::{self, Limits, OpKind, Response, Success, DEFAULT_MAX_READ};
use airlock_core::fsproxy::{Config, FsProxy, Input, Output, StdioRole};
use airlock_core::handles::{ClientId, Handle};
use airlock_core::policy::Policy;
use airlock_core::time::Instant;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use std::hint::black_box;
use std::time::Duration;

const OPEN: &[u8] = br#"{"id":"1","op":"open","params":{"path":"test.txt","mode":"w"}}"#;

fn write_request() -> Vec<u8> {
    let data = STANDARD.encode([0x5a_u8; 4096]);
    format!(r#"{{"id":"4","op":"write","params":{{"h":3,"data":"{data}","final":false}}}}"#).into_bytes()
}

fn read_response() -> Vec<u8> {
    wire::encode_response(&Response {
        id: Some("2".into()),
        outcome: Ok(Success::Data { data: vec![0x5a; 4096], eof: false }),
    })
}

/// Decode one frame from `framed` on `dec` (a connection's decoder, kept
/// from one request to the next as the machine keeps it) and validate it as
/// a request, then encode `answer` in place in its frame, as the machine
/// answers.
fn airlock_request(dec: &mut FrameDecoder, framed: &[u8], answer: &Success) -> Vec<u8> {
    dec.push(framed);
    let payload = dec.next_frame().ok().flatten().expect("bench payload frames");
    let req = wire::parse_request(&payload, Limits::default()).expect("bench payload is valid");
    let resp = Response { id: Some(req.id), outcome: Ok(answer.clone()) };
    frame::encode_with(|out| wire::encode_response_into(&resp, out))
}

/// Decode and check an upstream read response, then encode and frame it
/// for the client below under the client's id, as a forwarding proxy does
/// (its data passed on as the base64 text it came in).
fn airlock_response(dec: &mut FrameDecoder, framed: &[u8]) -> Vec<u8> {
    dec.push(framed);
    let payload = dec.next_frame().ok().flatten().expect("bench payload frames");
    let resp = wire::parse_upstream_response(payload, OpKind::Read, DEFAULT_MAX_READ)
        .expect("bench payload is valid");
    let resp = Response { id: Some("c7".into()), outcome: resp.outcome };
    frame::encode_with(|out| wire::encode_response_into(&resp, out))
}

fn codec(c: &mut Criterion) {
    let write = write_request();
    let read = read_response();
    let cases: [(&str, &[u8]); 3] = [("open", OPEN), ("write_4096", &write), ("read_4096_forwarded", &read)];
    let mut g = c.benchmark_group("frame");
    g.sample_size(20).measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(500));
    for (name, payload) in cases {
        let framed = frame::encode(payload);
        g.bench_function(format!("{name}/serde_json_value"), |b| {
            b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(payload)).expect("valid JSON"))
        });
        let mut dec = FrameDecoder::new(DEFAULT_MAX_FRAME);
        g.bench_function(format!("{name}/airlock"), |b| match name {
            "open" => {
                let answer = Success::Opened { handle: Handle::new(3) };
                b.iter(|| airlock_request(&mut dec, black_box(&framed), &answer))
            }
            "write_4096" => {
                let answer = Success::Written { written: 4096 };
                b.iter(|| airlock_request(&mut dec, black_box(&framed), &answer))
            }
            _ => b.iter(|| airlock_response(&mut dec, black_box(&framed))),
        });
    }
    g.finish();
}

const CLIENT: ClientId = ClientId(1);

/// A machine holding a 4096-byte virtual file, open for reading as handle 4.
fn machine_with_file() -> FsProxy {
    let mut m = FsProxy::new(Config::new(Policy::new("/home".into(), []), StdioRole::Local));
    m.handle(Instant::ZERO, Input::Connected { client: CLIENT });
    let data = STANDARD.encode([0x5a_u8; 4096]);
    let mut bytes = Vec::new();
    for req in [
        r#"{"id":"1","op":"open","params":{"path":"f","mode":"w"}}"#.to_owned(),
        format!(r#"{{"id":"2","op":"write","params":{{"h":3,"data":"{data}"}}}}"#),
        r#"{"id":"3","op":"open","params":{"path":"f","mode":"r"}}"#.to_owned(),
    ] {
        frame::encode_into(req.as_bytes(), &mut bytes);
    }
    m.handle(Instant::ZERO, Input::Bytes { client: CLIENT, data: bytes });
    while m.poll_output().is_some() {}
    m
}

fn machine(c: &mut Criterion) {
    let read = frame::encode(br#"{"id":"9","op":"read","params":{"h":4,"max":4096}}"#);
    let mut g = c.benchmark_group("machine");
    g.sample_size(20).measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(500));
    g.bench_function("virtual_read_4096_round_trip", |b| {
        b.iter_batched(
            machine_with_file,
            |mut m| {
                m.handle(Instant::ZERO, Input::Bytes { client: CLIENT, data: read.clone() });
                match m.poll_output() {
                    Some(Output::Send { data, .. }) => {
                        assert!(data.len() > 5000, "read did not return the file");
                        data
                    }
                    other => panic!("unexpected output {other:?}"),
                }
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, codec, machine);
criterion_main!(benches);
