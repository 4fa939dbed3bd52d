//! Batched reads answer exactly what the same reads served one at a time
//! answer, short reads, failures and departures included.

use super::*;
use crate::codec::frame;
use crate::fsproxy::{Config, Input, StdioRole};
use crate::fuzzing::{test_fs, test_policy, Shell};
use crate::policy::RootId;
use base64::Engine as _;
use proptest::prelude::*;
use serde_json::{json, Value};

const A: ClientId = ClientId(1);

fn shell(batch: u32, content: &[u8]) -> Shell {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.max_read_batch = batch;
    config.audit = true;
    let mut fs = test_fs();
    fs.files.insert((RootId(1), "f".into()), content.to_vec());
    let mut s = Shell::new(config, fs);
    s.connect(A);
    s
}

fn open(s: &mut Shell, mode: &str) -> u64 {
    s.send_json(A, &json!({"id": "o", "op": "open", "params": {"path": "/rw/f", "mode": mode}}));
    let r = s.responses(A).pop().unwrap_or_default();
    r.pointer("/result/handle").and_then(Value::as_u64).unwrap_or_else(|| panic!("open: {r}"))
}

fn read_req(id: &str, h: u64, max: u32) -> Value {
    json!({"id": id, "op": "read", "params": {"h": h, "max": max}})
}

fn stream(reqs: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in reqs {
        frame::encode_into(r.to_string().as_bytes(), &mut out);
    }
    out
}

fn data_of(r: &Value) -> (Vec<u8>, bool) {
    let d = r.pointer("/result/data").and_then(Value::as_str).unwrap_or_else(|| panic!("{r}"));
    let eof = r.pointer("/result/eof").and_then(Value::as_bool).unwrap_or_else(|| panic!("{r}"));
    (base64::engine::general_purpose::STANDARD.decode(d).unwrap_or_else(|e| panic!("{e}: {r}")), eof)
}

/// The `max` of every read effect issued so far.
fn read_effects(s: &Shell) -> Vec<u32> {
    s.effects
        .iter()
        .filter_map(|(_, e)| match e {
            Effect::Read { max, .. } => Some(*max),
            _ => None,
        })
        .collect()
}

/// Complete the oldest effect with `result`.
fn finish(s: &mut Shell, result: impl FnOnce(&mut Shell, &Effect) -> EffectResult) {
    let (id, effect) = s.effects.remove(0);
    let result = result(s, &effect);
    s.input(Input::EffectDone { id, result });
}

/// Perform a read effect as if the host returned at most `n` bytes.
fn short(n: u32) -> impl FnOnce(&mut Shell, &Effect) -> EffectResult {
    move |s, e| match e {
        Effect::Read { file, max } => s.fs.perform(&Effect::Read { file: *file, max: n.min(*max) }),
        other => panic!("not a read: {other:?}"),
    }
}

fn full(s: &mut Shell, e: &Effect) -> EffectResult {
    s.fs.perform(e)
}

/// Five pipelined reads of 10 bytes: the first alone, the other four
/// arriving while it is served, then joining one host read of 40 bytes.
fn five_reads(content: &[u8]) -> (Shell, u64) {
    let mut s = shell(DEFAULT_MAX_READ_BATCH, content);
    let h = open(&mut s, "r");
    s.auto = false;
    let reqs: Vec<Value> = (0..5).map(|i| read_req(&format!("r{i}"), h, 10)).collect();
    s.input(Input::Bytes { client: A, data: stream(&reqs[..1]) });
    s.input(Input::Bytes { client: A, data: stream(&reqs[1..]) });
    assert_eq!(read_effects(&s), [10]);
    finish(&mut s, full);
    assert_eq!(read_effects(&s), [40], "the four waiting reads in one host read");
    (s, h)
}

fn answers(s: &Shell) -> Vec<Value> {
    s.responses(A).into_iter().skip(1).collect()
}

#[test]
fn split_gives_each_read_at_most_its_max_in_order() {
    assert_eq!(split(40, &[10, 10, 10, 10]), [0..10, 10..20, 20..30, 30..40]);
    assert_eq!(split(15, &[10, 10, 10, 10]), [0..10, 10..15], "the rest read again");
    assert_eq!(split(0, &[10, 10, 10]), [0..0, 0..0, 0..0], "the end of the file, for each");
    assert_eq!(split(7, &[3, 1, 8]), [0..3, 3..4, 4..7]);
    assert_eq!(split(50, &[10, 10]), [0..10, 10..20], "bytes past the maxes go nowhere");
}

#[test]
fn queued_reads_of_one_handle_take_one_host_read() {
    let content: Vec<u8> = (0..=255).cycle().take(100).collect();
    let (mut s, _) = five_reads(&content);
    finish(&mut s, full);
    let got: Vec<(Vec<u8>, bool)> = answers(&s).iter().map(data_of).collect();
    let want: Vec<(Vec<u8>, bool)> = content[..50].chunks(10).map(|c| (c.to_vec(), false)).collect();
    assert_eq!(got, want);
    let ids: Vec<Value> = answers(&s).iter().map(|r| r["id"].clone()).collect();
    assert_eq!(ids, ["r0", "r1", "r2", "r3", "r4"]);
    assert!(s.effects.is_empty());
}

#[test]
fn reads_arriving_together_take_one_host_read() {
    let content: Vec<u8> = (0..100).collect();
    let mut s = shell(DEFAULT_MAX_READ_BATCH, &content);
    let h = open(&mut s, "r");
    s.auto = false;
    let reqs: Vec<Value> = (0..5).map(|i| read_req(&format!("r{i}"), h, 10)).collect();
    s.input(Input::Bytes { client: A, data: stream(&reqs) });
    assert_eq!(read_effects(&s), [50], "the first served waits for the input's other reads");
    finish(&mut s, full);
    let got: Vec<Vec<u8>> = s.responses(A).iter().skip(1).map(|r| data_of(r).0).collect();
    assert_eq!(got, content[..50].chunks(10).collect::<Vec<_>>());
}

#[test]
fn a_read_alone_is_asked_of_the_host_as_its_input_ends() {
    let content: Vec<u8> = (0..100).collect();
    let mut s = shell(DEFAULT_MAX_READ_BATCH, &content);
    let h = open(&mut s, "r");
    s.auto = false;
    s.input(Input::Bytes { client: A, data: stream(&[read_req("r", h, 10)]) });
    assert_eq!(read_effects(&s), [10]);
    // With batches off, each read is asked for as it is served.
    let mut s = shell(0, &content);
    let h = open(&mut s, "r");
    s.auto = false;
    s.input(Input::Bytes { client: A, data: stream(&[read_req("r", h, 10), read_req("s", h, 10)]) });
    assert_eq!(read_effects(&s), [10]);
}

#[test]
fn a_short_host_read_answers_the_reads_it_reaches_and_reads_again_for_the_rest() {
    let content: Vec<u8> = (0..100).collect();
    let (mut s, _) = five_reads(&content);
    // 15 of the 40 bytes asked: r1 whole, r2 short, r3 and r4 read again.
    finish(&mut s, short(15));
    let got: Vec<(Vec<u8>, bool)> = answers(&s).iter().map(data_of).collect();
    assert_eq!(
        got,
        [
            (content[..10].to_vec(), false),
            (content[10..20].to_vec(), false),
            (content[20..25].to_vec(), false)
        ]
    );
    assert_eq!(read_effects(&s), [20]);
    finish(&mut s, full);
    let got: Vec<Vec<u8>> = answers(&s).iter().map(|r| data_of(r).0).collect();
    assert_eq!(got.concat(), content[..45]);
    assert_eq!(answers(&s).len(), 5);
    assert!(s.effects.is_empty());
}

#[test]
fn the_end_of_the_file_answers_every_read_of_the_batch_with_eof() {
    let content = b"0123456789abc".to_vec();
    let (mut s, _) = five_reads(&content);
    // 3 bytes left: r1 gets them, the rest read again and find the end.
    finish(&mut s, full);
    let got: Vec<(Vec<u8>, bool)> = answers(&s).iter().map(data_of).collect();
    assert_eq!(got, [(content[..10].to_vec(), false), (b"abc".to_vec(), false)]);
    assert_eq!(read_effects(&s), [30]);
    finish(&mut s, full);
    let got: Vec<(Vec<u8>, bool)> = answers(&s).iter().skip(2).map(data_of).collect();
    assert_eq!(got, vec![(Vec::new(), true); 3]);
    assert!(s.effects.is_empty());
}

#[test]
fn a_failed_host_read_fails_only_the_first_read_of_the_batch() {
    let content: Vec<u8> = (0..100).collect();
    let (mut s, _) = five_reads(&content);
    finish(&mut s, |s, e| s.fs.fail(e));
    let a = answers(&s);
    assert_eq!((a.len(), a[1]["id"].clone(), a[1]["error"]["code"].clone()), (2, json!("r1"), json!("E_IO")));
    // The other three try their own read, again as one.
    assert_eq!(read_effects(&s), [30]);
    finish(&mut s, full);
    let got: Vec<Vec<u8>> = answers(&s).iter().skip(2).map(|r| data_of(r).0).collect();
    assert_eq!(got.concat(), content[10..40]);
}

#[test]
fn an_unexpected_result_fails_only_the_first_read_of_the_batch() {
    let content: Vec<u8> = (0..100).collect();
    let (mut s, _) = five_reads(&content);
    finish(&mut s, |_, _| EffectResult::Closed);
    assert_eq!(answers(&s)[1]["error"]["code"], json!("E_IO"));
    assert_eq!(read_effects(&s), [30]);
}

#[test]
fn a_batch_ends_at_the_first_request_that_is_not_a_read_of_its_handle() {
    let content: Vec<u8> = (0..100).collect();
    let mut s = shell(DEFAULT_MAX_READ_BATCH, &content);
    let h = open(&mut s, "rw");
    let other = open(&mut s, "r");
    s.auto = false;
    let reqs = [
        read_req("a", h, 10),
        read_req("b", h, 10),
        read_req("c", h, 10),
        json!({"id": "w", "op": "write", "params": {"h": h, "data": "WFla"}}),
        read_req("d", h, 10),
        read_req("e", other, 10),
        read_req("f", h, 10),
        json!({"id": "x", "op": "close", "params": {"h": h}}),
    ];
    s.input(Input::Bytes { client: A, data: stream(&reqs) });
    let mut maxes = Vec::new();
    while !s.effects.is_empty() {
        if let Effect::Read { max, .. } = s.effects[0].1 {
            maxes.push(max);
        }
        finish(&mut s, full);
    }
    assert_eq!(maxes, [30, 10, 10, 10], "a, b and c together; nothing past the write or another handle");
    let ids: Vec<Value> = s.responses(A).iter().skip(2).map(|r| r["id"].clone()).collect();
    assert_eq!(ids, ["a", "b", "c", "w", "d", "e", "f", "x"]);
    let data: Vec<Vec<u8>> = [0, 1, 2, 4, 5, 6].iter().map(|&i| data_of(&s.responses(A)[2 + i]).0).collect();
    assert_eq!(data[..3].concat(), content[..30]);
    assert_eq!(data[3], content[33..43], "d reads after the write's 3 bytes");
    assert_eq!(data[4], content[..10], "another handle has its own offset");
    assert_eq!(data[5], content[43..53]);
}

#[test]
fn a_batch_is_capped_by_max_read_batch() {
    let content = vec![7u8; 1000];
    let mut s = shell(25, &content);
    let h = open(&mut s, "r");
    s.auto = false;
    let reqs: Vec<Value> = (0..8).map(|i| read_req(&i.to_string(), h, 10)).collect();
    s.input(Input::Bytes { client: A, data: stream(&reqs) });
    let mut maxes = Vec::new();
    while !s.effects.is_empty() {
        if let Effect::Read { max, .. } = s.effects[0].1 {
            maxes.push(max);
        }
        finish(&mut s, full);
    }
    assert_eq!(maxes, [20, 20, 20, 20]);
    assert_eq!(s.responses(A).len(), 9);
}

#[test]
fn batched_reads_stay_counted_against_the_queue_bounds_until_answered() {
    let content: Vec<u8> = (0..100).collect();
    let mut s = shell(DEFAULT_MAX_READ_BATCH, &content);
    let h = open(&mut s, "r");
    s.auto = false;
    let reqs: Vec<Value> = (0..5).map(|i| read_req(&format!("r{i}"), h, 10)).collect();
    let frames: Vec<u64> = reqs.iter().map(|r| r.to_string().len() as u64).collect();
    s.input(Input::Bytes { client: A, data: stream(&reqs) });
    let waiting = |from: usize| frames[from..].iter().sum::<u64>();
    // r0 is served; r1..r4 wait in its batch, counted as when queued.
    assert_eq!(read_effects(&s), [50]);
    assert_eq!(s.proxy.usage().queued_bytes, waiting(1));
    finish(&mut s, short(15));
    // r0 and r1 answered; r2 served again, r3 and r4 wait.
    assert_eq!(s.proxy.usage().queued_bytes, waiting(3));
    finish(&mut s, full);
    assert_eq!(s.proxy.usage().queued_bytes, 0);
}

#[test]
fn batched_reads_count_against_max_queued_requests() {
    let content: Vec<u8> = (0..100).collect();
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.max_queued_requests = 3;
    let mut fs = test_fs();
    fs.files.insert((RootId(1), "f".into()), content);
    let mut s = Shell::new(config, fs);
    s.connect(A);
    let h = open(&mut s, "r");
    s.auto = false;
    let reqs: Vec<Value> = (0..4).map(|i| read_req(&format!("r{i}"), h, 10)).collect();
    s.input(Input::Bytes { client: A, data: stream(&reqs) });
    assert_eq!(read_effects(&s), [40]);
    // r0 served, r1..r3 in its batch: three wait, as many as may.
    s.input(Input::Bytes { client: A, data: stream(&[read_req("x", h, 10)]) });
    let refused: Vec<Value> =
        s.responses(A).iter().filter(|r| r["ok"] == json!(false)).map(|r| r["id"].clone()).collect();
    assert_eq!(refused, ["x"]);
    finish(&mut s, full);
    s.input(Input::Bytes { client: A, data: stream(&[read_req("y", h, 10)]) });
    assert_eq!(s.responses(A).last().map(|r| r["ok"].clone()), Some(json!(true)));
}

#[test]
fn a_client_leaving_during_a_batch_gets_nothing_and_its_file_is_closed() {
    let content: Vec<u8> = (0..100).collect();
    let (mut s, _) = five_reads(&content);
    s.input(Input::Eof { client: A });
    let before = s.responses(A).len();
    finish(&mut s, full);
    assert_eq!(s.responses(A).len(), before, "nothing sent after departure");
    s.settle();
    assert_eq!(s.fs.open_files(), 0);
    assert_eq!(s.proxy.open_handles(), 0);
    assert_eq!(s.proxy.tracked_clients(), 0);
    assert_eq!(s.proxy.usage().queued_bytes, 0);
}

#[derive(Clone, Debug)]
enum Req {
    Read(u32),
    Write(Vec<u8>),
    /// Close the handle and open the file again (reading from the start).
    Reopen,
}

fn req() -> impl Strategy<Value = Req> {
    prop_oneof![
        8 => (1u32..=4096).prop_map(Req::Read),
        8 => (1u32..=40).prop_map(Req::Read),
        1 => proptest::collection::vec(any::<u8>(), 1..50).prop_map(Req::Write),
        1 => Just(Req::Reopen),
    ]
}

/// The requests as frames: each reopen's `open` returns handle 3 + the
/// reopens before it.
fn frames(reqs: &[Req]) -> Vec<Value> {
    let mut h = 3;
    let mut out = vec![json!({"id": "o", "op": "open", "params": {"path": "/rw/f", "mode": "rw"}})];
    for (i, r) in reqs.iter().enumerate() {
        let id = format!("q{i}");
        match r {
            Req::Read(max) => out.push(read_req(&id, h, *max)),
            Req::Write(d) => {
                let data = base64::engine::general_purpose::STANDARD.encode(d);
                out.push(json!({"id": id, "op": "write", "params": {"h": h, "data": data}}));
            }
            Req::Reopen => {
                out.push(json!({"id": id, "op": "close", "params": {"h": h}}));
                out.push(
                    json!({"id": format!("{id}o"), "op": "open", "params": {"path": "/rw/f", "mode": "rw"}}),
                );
                h += 1;
            }
        }
    }
    out
}

/// How the host answers one read effect.
#[derive(Clone, Copy, Debug)]
enum Host {
    Full,
    Short(u32),
    Fail,
}

fn host() -> impl Strategy<Value = Host> {
    prop_oneof![6 => Just(Host::Full), 2 => (1u32..5000).prop_map(Host::Short), 1 => Just(Host::Fail)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// With a host that reads what is asked, batched reads answer exactly
    /// what the same reads one at a time answer, byte for byte, however
    /// the requests are pipelined and chunked, writes and reopens between.
    #[test]
    fn batched_answers_equal_sequential_answers(
        content in proptest::collection::vec(any::<u8>(), 0..20_000),
        reqs in proptest::collection::vec(req(), 1..60),
        batch in prop_oneof![Just(DEFAULT_MAX_READ_BATCH), 1u32..10_000],
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let bytes = stream(&frames(&reqs));
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        points.extend([0, bytes.len()]);
        points.sort_unstable();
        let mut one_by_one = shell(0, &content);
        one_by_one.input(Input::Bytes { client: A, data: bytes.clone() });
        let mut batched = shell(batch, &content);
        for w in points.windows(2) {
            batched.input(Input::Bytes { client: A, data: bytes[w[0]..w[1]].to_vec() });
        }
        prop_assert_eq!(&batched.events, &one_by_one.events);
        prop_assert_eq!(&batched.fs.files, &one_by_one.fs.files);
        prop_assert_eq!(batched.proxy.usage().queued_bytes, 0);
    }

    /// With a host whose reads may come up short or fail, every read is
    /// answered once, in order, within its `max`; the bytes answered are
    /// the file's, in order; `eof` comes only at the end of the file; and
    /// each failure of the host fails exactly one read.
    #[test]
    fn short_and_failed_host_reads_split_as_sequential_reads_would(
        content in proptest::collection::vec(any::<u8>(), 0..20_000),
        maxes in proptest::collection::vec(1u32..=4096, 1..80),
        hosts in proptest::collection::vec(host(), 1..40),
        window in 1usize..40,
    ) {
        let mut s = shell(DEFAULT_MAX_READ_BATCH, &content);
        let h = open(&mut s, "r");
        s.auto = false;
        let mut sent = 0;
        let mut failures = 0;
        let mut step = 0;
        loop {
            // Keep `window` reads in flight, as a pipelining client does.
            let answered = s.responses(A).len() - 1;
            while sent < maxes.len() && sent - answered < window {
                s.input(Input::Bytes { client: A, data: stream(&[read_req(&sent.to_string(), h, maxes[sent])]) });
                sent += 1;
            }
            if s.effects.is_empty() {
                break;
            }
            match hosts[step % hosts.len()] {
                Host::Full => finish(&mut s, full),
                Host::Short(n) => finish(&mut s, short(n)),
                Host::Fail => {
                    failures += 1;
                    finish(&mut s, |s, e| s.fs.fail(e));
                }
            }
            step += 1;
        }
        let answers = answers(&s);
        prop_assert_eq!(answers.len(), maxes.len());
        let mut pos = 0;
        let mut failed = 0;
        for (i, r) in answers.iter().enumerate() {
            prop_assert_eq!(&r["id"], &json!(i.to_string()));
            if r["ok"] == json!(false) {
                prop_assert_eq!(&r["error"]["code"], &json!("E_IO"));
                failed += 1;
                continue;
            }
            let (data, eof) = data_of(r);
            prop_assert!(data.len() <= maxes[i] as usize);
            prop_assert_eq!(eof, data.is_empty());
            prop_assert!(!eof || pos == content.len(), "eof at {} of {}", pos, content.len());
            prop_assert_eq!(&data[..], &content[pos..pos + data.len()]);
            pos += data.len();
        }
        prop_assert_eq!(failed, failures);
        prop_assert_eq!(s.proxy.usage().queued_bytes, 0);
    }
}
