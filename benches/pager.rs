//! What wrapping and paging cost in the core, against a plain copy of the
//! same bytes.
//!
//! The content is mixed-length text lines (0 to 300 characters, a few
//! multi-byte), 10 MB and 100 MB, fed in 48 KiB chunks as `airlock fd
//! wrap` streams them. `copy` is `Vec::extend_from_slice` of the same
//! chunks: the floor for storing the bytes once. Then one page, the last,
//! read and rendered as XML, and a line range in the middle.

use airlock_core::pager::store::{Builder, Document};
use airlock_core::pager::xml;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const CHUNK: usize = 48 * 1024;

fn content(bytes: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes + 400);
    let mut i: u64 = 0;
    while out.len() < bytes {
        let len = (i.wrapping_mul(7919) % 301) as usize;
        out.extend_from_slice(format!("{i} ").as_bytes());
        for k in 0..len {
            if k % 97 == 96 {
                out.extend_from_slice("é".as_bytes());
            } else {
                out.push(b'a' + (k % 26) as u8);
            }
        }
        out.push(b'\n');
        i += 1;
    }
    out.truncate(bytes);
    // End on a whole line.
    while out.last().is_some_and(|&b| b != b'\n') {
        out.pop();
    }
    out
}

fn wrap(data: &[u8]) -> Document {
    let mut b = Builder::new(4000);
    for c in data.chunks(CHUNK) {
        b.push(c, u64::MAX).expect("no limit");
    }
    b.finish()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("wrap");
    g.sample_size(10);
    for mb in [10usize, 100] {
        let data = content(mb * 1_000_000);
        g.throughput(Throughput::Bytes(data.len() as u64));
        g.bench_with_input(BenchmarkId::new("copy", mb), &data, |b, data| {
            b.iter(|| {
                let mut v = Vec::new();
                for c in data.chunks(CHUNK) {
                    v.extend_from_slice(c);
                }
                v
            })
        });
        g.bench_with_input(BenchmarkId::new("pager", mb), &data, |b, data| b.iter(|| wrap(data)));
    }
    g.finish();

    let data = content(100_000_000);
    let doc = wrap(&data);
    let mut g = c.benchmark_group("page_of_100mb");
    g.bench_function("last_page", |b| {
        b.iter(|| {
            let n = doc.pages();
            let (head, span) = xml::page_head("fd:1", &doc, n).expect("page exists");
            xml::render_span(&doc, &head, span, xml::CONTENT_TAIL, None, 1 << 20).expect("renders")
        })
    });
    g.bench_function("lines_in_the_middle", |b| {
        let mid = doc.total_lines() / 2;
        b.iter(|| {
            let span = doc.lines(mid, mid + 20).expect("lines exist");
            xml::render_span(&doc, "<fd_content>", span, xml::CONTENT_TAIL, None, 1 << 20).expect("renders")
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
