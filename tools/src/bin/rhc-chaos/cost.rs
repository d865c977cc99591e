//! A benchmark: what the events cost in requests to S3 at the default upload window, for the
//! cost table of docs/sizing-and-cost.md.
//!
//! The collector runs as a user starts it (only storage, spool, port and identity) behind a
//! proxy that records every request it makes to the S3 server (testkit's fault proxy, with no
//! fault), under a steady load of Ray-like task events spread over a number of jobs (one open
//! partition each). After a warm-up the requests of a fixed period are counted by S3's price
//! classes: PUT, COPY, POST and LIST at one price, GET and HEAD at another, DELETE free. The
//! figures are per node; nodes do not share partitions, so a cluster costs the sum.

use std::thread;
use std::time::{Duration, Instant};

use crate::load::{Load, LoadSpec};
use crate::node_loss::{batch_for, start_ours, CLIENTS};
use crate::{skip, Ctx, Verdict};
use rhc_testkit::fault_proxy::{FaultProxy, SeenRequest};
use serde_json::json;

/// S3 Standard list prices in us-east-1 (as published in November 2026), dollars per 1,000
/// requests.
pub(crate) const PUT_CLASS_PER_1000: f64 = 0.005;
pub(crate) const GET_CLASS_PER_1000: f64 = 0.0004;
/// The load before counting: the first objects are created, the rounds settle.
const WARM_UP: Duration = Duration::from_secs(15);
/// With one partition at 2,000 events/s or more, the load before counting is long enough
/// for an object to pass 5 MiB of gzip if it ever does (at about 70 bytes of gzip per
/// event, 25 s), from where the collector may grow it by appends (UploadPartCopy of the
/// object plus the new part, four requests): that row shows which requests large objects
/// cost. (Measured 2026-11-26: whole PUTs only; a segment seals at 64 MiB of lines first.)
const WARM_UP_APPENDS: Duration = Duration::from_secs(45);
/// Partitions of the default rows: 8 and 64 jobs, and one job (the largest objects).
const PARTITIONS: &[u32] = &[8, 64, 1];
/// The period counted (several upload windows).
const MEASURE: Duration = Duration::from_secs(60);

#[derive(Default, Clone, Copy)]
struct Classes {
    put: u64,
    copy: u64,
    post: u64,
    list: u64,
    get: u64,
    head: u64,
    delete: u64,
}

impl Classes {
    fn of(seen: &[SeenRequest]) -> Classes {
        let mut c = Classes::default();
        for r in seen {
            match r.method.as_str() {
                "PUT" if r.is_copy() => c.copy += 1,
                "PUT" => c.put += 1,
                "POST" => c.post += 1,
                "GET"
                    if r.target.contains("list-type")
                        || !r.target.get(1..).unwrap_or("").contains('/') =>
                {
                    c.list += 1
                }
                "GET" => c.get += 1,
                "HEAD" => c.head += 1,
                "DELETE" => c.delete += 1,
                _ => {}
            }
        }
        c
    }

    fn put_class(&self) -> u64 {
        self.put + self.copy + self.post + self.list
    }

    fn get_class(&self) -> u64 {
        self.get + self.head
    }
}

/// Dollars per day for these requests per second.
pub(crate) fn dollars_per_day(put_per_s: f64, get_per_s: f64) -> f64 {
    86_400.0 * (put_per_s * PUT_CLASS_PER_1000 + get_per_s * GET_CLASS_PER_1000) / 1000.0
}

pub(crate) fn upload_cost(ctx: &Ctx) -> Result<Verdict, String> {
    if !ctx.storage.can_cut() {
        return Ok(skip(
            "needs an S3 server (--storage moto:…): requests are counted on their way to it",
        ));
    }
    let rates: Vec<f64> = if ctx.args.rates.is_empty() {
        vec![200.0, 2_000.0]
    } else {
        ctx.args.rates.clone()
    };
    let mut rows = Vec::new();
    println!(
        "upload-cost: {} s counted after {} s of load ({} s for one partition at 2,000 events/s: objects past 5 MiB, if they get there), at the collector's default upload window",
        MEASURE.as_secs(),
        WARM_UP.as_secs(),
        WARM_UP_APPENDS.as_secs()
    );
    println!("| ev/s | partitions | events counted | PUT | COPY | POST | LIST | GET | HEAD | DELETE | PUT-class/s | GET-class/s | $/day per node | MB/s uploaded | bytes uploaded per event | bytes stored per event |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let partitions_list: Vec<u32> = if ctx.args.cost_partitions.is_empty() {
        PARTITIONS.to_vec()
    } else {
        ctx.args.cost_partitions.clone()
    };
    for &partitions in &partitions_list {
        for &rate in &rates {
            let warm_up = if rate / partitions as f64 >= 2_000.0 {
                WARM_UP_APPENDS
            } else if partitions == 1 {
                continue;
            } else {
                WARM_UP
            };
            let n = ctx.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let bucket = format!("chaos-cost-{n}");
            ctx.storage.create_bucket(&bucket)?;
            let proxy = FaultProxy::start(&format!("127.0.0.1:{}", ctx.storage.port))?;
            let dir = ctx.work.join(format!("cost-{n}"));
            let mut node = start_ours(ctx, &ctx.storage, proxy.port, &bucket, &dir, None)?;
            let mut spec = LoadSpec::new(&format!("cost{n}"), CLIENTS, batch_for(rate));
            spec.rate = rate;
            spec.jobs = partitions;
            spec.max = warm_up + MEASURE + Duration::from_secs(30);
            let load = Load::start(node.port(), spec);
            thread::sleep(warm_up);
            proxy.forget();
            let acked0 = load.acked();
            let t = Instant::now();
            thread::sleep(MEASURE);
            let seen = proxy.seen();
            let secs = t.elapsed().as_secs_f64();
            let events = load.acked() - acked0;
            // Bytes sent to the store: the bodies of the requests, as declared.
            let bytes: f64 = seen
                .iter()
                .filter_map(|r| r.header("content-length")?.parse::<f64>().ok())
                .sum();
            node.kill9();
            let mut ledger = crate::load::Ledger::default();
            load.finish(&mut ledger);
            drop(node);
            // What the bucket holds per event (gzip), against what was sent per event.
            let mut stored = 0u64;
            crate::storage::for_each_object(&ctx.storage.store(&bucket)?, |key, b| {
                if key.contains("/job_events/") || key.contains("/node_events/") {
                    stored += b.len() as u64;
                }
            })?;
            let stored_per_event = stored as f64 / ledger.count(crate::load::ACKED).max(1) as f64;
            let _ = std::fs::remove_dir_all(&dir);
            let c = Classes::of(&seen);
            let put_s = c.put_class() as f64 / secs;
            let get_s = c.get_class() as f64 / secs;
            let usd = dollars_per_day(put_s, get_s);
            let per_event = bytes / events.max(1) as f64;
            println!(
                "| {rate} | {partitions} | {events} | {} | {} | {} | {} | {} | {} | {} | {put_s:.2} | {get_s:.2} | {usd:.3} | {:.2} | {per_event:.0} | {stored_per_event:.0} |",
                c.put, c.copy, c.post, c.list, c.get, c.head, c.delete, bytes / secs / 1e6
            );
            rows.push(
                json!({"rate": rate, "partitions": partitions, "seconds": secs, "events": events,
                             "put": c.put, "copy": c.copy, "post": c.post, "list": c.list,
                             "get": c.get, "head": c.head, "delete": c.delete,
                             "put_class_per_s": put_s, "get_class_per_s": get_s,
                             "usd_per_day_per_node": usd}),
            );
        }
    }
    let mut text = String::from("requests per node, at the default window:");
    for r in &rows {
        let (put_s, get_s) = (
            r["put_class_per_s"].as_f64().unwrap_or(0.0),
            r["get_class_per_s"].as_f64().unwrap_or(0.0),
        );
        text.push_str(&format!(
            " {} ev/s × {} partitions: {put_s:.2} PUT-class/s + {get_s:.2} GET-class/s, ${:.3}/day (×100 nodes ${:.2}, ×1,000 ${:.1});",
            r["rate"], r["partitions"],
            dollars_per_day(put_s, get_s),
            100.0 * dollars_per_day(put_s, get_s),
            1000.0 * dollars_per_day(put_s, get_s),
        ));
    }
    let pass = rows.iter().all(|r| {
        r["events"].as_u64().unwrap_or(0) > 0 && r["put_class_per_s"].as_f64().unwrap_or(0.0) > 0.0
    });
    Ok(Verdict::new(
        pass,
        text,
        json!({"rows": rows,
        "prices_per_1000": {"put_copy_post_list": PUT_CLASS_PER_1000, "get_head": GET_CLASS_PER_1000}}),
    ))
}
