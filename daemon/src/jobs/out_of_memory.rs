//! What happens to a job whose worker ran out of memory (`WorkerExit::OutOfMemory`): **pure**,
//! the supervisor feeds it the job's request, its history and the worker's report.
//!
//! The rule: an out-of-memory is not a crash (it is never counted as one). The first one requeues
//! the job with a larger `[resources] memory_gb` — 1.5 × the request, and at least 1.2 × the
//! peak the worker reported, rounded up to 0.1 GB — and its `resident_gb`, when it has one,
//! grown by the same factor, when that fits a device of this daemon; the scheduler then admits it
//! by the larger request, and its worker gets the larger cap. A second
//! one fails the job, naming the request, the peak, the cap and the phase. So does the first one
//! of a job that had the whole device (`memory_gb = 0`: nothing larger to ask for), or whose
//! larger request would fit no device here.

use rlvr_protocol::memory::{BYTES_PER_GB, up_to_a_tenth};
use rlvr_protocol::worker::OutOfMemory;

/// How much larger the second request is than the first, at least.
pub const GROWTH: f64 = 1.5;
/// How much larger the second request is than the peak the worker reported, at least.
pub const PEAK_MARGIN: f64 = 1.2;

/// A worker run that ended out of memory, as the supervisor knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Ran<'a> {
    /// The job's `[resources] memory_gb` for this run (0: whole devices).
    pub memory_gb: f64,
    /// Its `[resources] resident_gb`, when it has one.
    pub resident_gb: Option<f64>,
    /// Requeues with a larger request the job had before this run.
    pub earlier: u32,
    /// The worker's report; `None` when its last line was not one (the numbers are unknown).
    pub report: Option<&'a OutOfMemory>,
    /// The devices it ran on, by the daemon's names (`cpu:0`, `cuda:1`).
    pub devices: &'a str,
}

/// What becomes of the job.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Requeue it once with this `memory_gb` and `resident_gb`; the reason for its events.
    Requeue { memory_gb: f64, resident_gb: Option<f64>, reason: String },
    /// Fail it, for this reason.
    Fail(String),
}

/// The job's next step after `ran`; `fits` says whether a request of that `memory_gb` and
/// `resident_gb` fits a device of this daemon (`Err`: why not).
pub fn next(ran: &Ran<'_>, fits: impl FnOnce(f64, Option<f64>) -> Result<(), String>) -> Next {
    let place = where_and_how_much(ran);
    if ran.memory_gb <= 0.0 {
        return Next::Fail(format!(
            "out of memory {place}; it had the whole device (resources.memory_gb = 0): there is no larger \
             request to make"
        ));
    }
    if ran.earlier > 0 {
        return Next::Fail(format!(
            "out of memory again {place}, with resources.memory_gb {} GB, raised once already after an \
             earlier out-of-memory; give the job more memory and resubmit",
            ran.memory_gb
        ));
    }
    let larger = larger_request(ran.memory_gb, ran.report.map(|report| report.peak_bytes));
    let resident = ran.resident_gb.map(|resident| grown_resident(resident, ran.memory_gb, larger));
    let resident_change = match (ran.resident_gb, resident) {
        (Some(before), Some(after)) => format!(", resident_gb {before} → {after} GB"),
        _ => String::new(),
    };
    match fits(larger, resident) {
        Ok(()) => Next::Requeue {
            memory_gb: larger,
            resident_gb: resident,
            reason: format!(
                "requeued after running out of memory {place}: resources.memory_gb {} → {larger} GB{resident_change}",
                ran.memory_gb
            ),
        },
        Err(why) => Next::Fail(format!(
            "out of memory {place}, with resources.memory_gb {} GB; the larger request of {larger} GB fits no \
             device here: {why}",
            ran.memory_gb
        )),
    }
}

/// The request after an out-of-memory: [`GROWTH`] × `memory_gb`, at least [`PEAK_MARGIN`] × the
/// peak, rounded up to 0.1 GB.
pub fn larger_request(memory_gb: f64, peak_bytes: Option<u64>) -> f64 {
    let peak_gb = peak_bytes.map_or(0.0, |bytes| bytes as f64 / BYTES_PER_GB);
    up_to_a_tenth((memory_gb * GROWTH).max(peak_gb * PEAK_MARGIN))
}

/// `resident_gb` grown as `memory_gb` grew to `larger` (rounded up to 0.1 GB), never past
/// `larger`, of which it is a part.
pub fn grown_resident(resident_gb: f64, memory_gb: f64, larger: f64) -> f64 {
    up_to_a_tenth(resident_gb * larger / memory_gb).min(larger)
}

/// `on cpu:0 in the update phase (peak 1.02 GB, cap 1.00 GB)`.
fn where_and_how_much(ran: &Ran<'_>) -> String {
    match ran.report {
        Some(report) => {
            let (peak, cap) = peak_and_cap(report.peak_bytes, report.cap_bytes);
            format!("on {} {} (peak {peak}, cap {cap})", ran.devices, report.when())
        }
        None => format!("on {} (peak and cap not reported)", ran.devices),
    }
}

/// The peak and the cap in GB, with 2 decimals, or as many more (up to 4) as it takes for a peak
/// past the cap not to read as equal to it.
fn peak_and_cap(peak: u64, cap: Option<u64>) -> (String, String) {
    let gb = |bytes: u64, decimals: usize| format!("{:.decimals$} GB", bytes as f64 / BYTES_PER_GB);
    let Some(cap) = cap else { return (gb(peak, 2), "none".to_owned()) };
    let decimals =
        (2..=4).find(|&decimals| peak == cap || gb(peak, decimals) != gb(cap, decimals)).unwrap_or(4);
    (gb(peak, decimals), gb(cap, decimals))
}

#[cfg(test)]
mod tests {
    use expect_test::{Expect, expect};
    use rlvr_protocol::grants::Phase;

    use super::*;

    const GB: u64 = 1 << 30;

    fn report(peak_bytes: u64, cap_bytes: u64, phase: Option<Phase>) -> OutOfMemory {
        OutOfMemory { device: "cpu".into(), phase, peak_bytes, cap_bytes: Some(cap_bytes) }
    }

    /// One case: the run, the largest request that fits here, what the rule says.
    fn check(memory_gb: f64, earlier: u32, report: Option<&OutOfMemory>, largest_gb: f64, expected: Expect) {
        check_resident(memory_gb, None, earlier, report, largest_gb, expected);
    }

    /// [`check`] for a job with a `resident_gb`.
    fn check_resident(
        memory_gb: f64,
        resident_gb: Option<f64>,
        earlier: u32,
        report: Option<&OutOfMemory>,
        largest_gb: f64,
        expected: Expect,
    ) {
        let ran = Ran { memory_gb, resident_gb, earlier, report, devices: "cpu:0" };
        let fits = |gb: f64, resident: Option<f64>| {
            assert!(resident.is_none_or(|resident| resident <= gb), "{resident:?} > {gb}");
            if gb <= largest_gb {
                Ok(())
            } else {
                Err(format!("no device has {gb} GB (cpu:0 {largest_gb} GB)"))
            }
        };
        let shown = match next(&ran, fits) {
            Next::Requeue { memory_gb, resident_gb: Some(resident), reason } => {
                format!("requeue at {memory_gb} (resident {resident}): {reason}")
            }
            Next::Requeue { memory_gb, resident_gb: None, reason } => {
                format!("requeue at {memory_gb}: {reason}")
            }
            Next::Fail(reason) => format!("fail: {reason}"),
        };
        expected.assert_eq(&shown);
    }

    #[test]
    fn the_first_out_of_memory_asks_for_more_once_and_the_second_fails() {
        // 1.5 × the request, rounded up to 0.1 GB; it names the old and new requests, the peak,
        // the cap and the phase.
        let update = report(GB + GB / 50, GB, Some(Phase::Update));
        check(
            1.0,
            0,
            Some(&update),
            8.0,
            expect![
                "requeue at 1.5: requeued after running out of memory on cpu:0 in the update phase (peak 1.02 GB, cap 1.00 GB): resources.memory_gb 1 → 1.5 GB"
            ],
        );
        // The peak decides when 1.2 × it is more (a libtorch allocation that failed far above).
        let rollout = report(3 * GB, GB, Some(Phase::Rollout));
        check(
            1.0,
            0,
            Some(&rollout),
            8.0,
            expect![
                "requeue at 3.6: requeued after running out of memory on cpu:0 in the rollout phase (peak 3.00 GB, cap 1.00 GB): resources.memory_gb 1 → 3.6 GB"
            ],
        );
        // The peak decides for a request smaller than the worker's libraries; no report: 1.5 ×.
        let loading = report(380 * (1 << 20), 53_687_091, None);
        check(
            0.05,
            0,
            Some(&loading),
            8.0,
            expect![
                "requeue at 0.5: requeued after running out of memory on cpu:0 before its first device phase (peak 0.37 GB, cap 0.05 GB): resources.memory_gb 0.05 → 0.5 GB"
            ],
        );
        check(
            0.7,
            0,
            None,
            8.0,
            expect![
                "requeue at 1.1: requeued after running out of memory on cpu:0 (peak and cap not reported): resources.memory_gb 0.7 → 1.1 GB"
            ],
        );
        // A resident part grows by the same factor (to the tenth, within the request).
        check_resident(
            1.2,
            Some(0.6),
            0,
            Some(&update),
            8.0,
            expect![
                "requeue at 1.8 (resident 0.9): requeued after running out of memory on cpu:0 in the update phase (peak 1.02 GB, cap 1.00 GB): resources.memory_gb 1.2 → 1.8 GB, resident_gb 0.6 → 0.9 GB"
            ],
        );
        let loaded = report(450 << 20, 2 * GB / 5, None);
        check_resident(
            0.4,
            Some(0.4),
            0,
            Some(&loaded),
            8.0,
            expect![
                "requeue at 0.6 (resident 0.6): requeued after running out of memory on cpu:0 before its first device phase (peak 0.44 GB, cap 0.40 GB): resources.memory_gb 0.4 → 0.6 GB, resident_gb 0.4 → 0.6 GB"
            ],
        );
        // The second out-of-memory fails, naming the numbers.
        let again = report(3 * GB / 2 + GB / 100, 3 * GB / 2, Some(Phase::Update));
        check(
            1.5,
            1,
            Some(&again),
            8.0,
            expect![
                "fail: out of memory again on cpu:0 in the update phase (peak 1.51 GB, cap 1.50 GB), with resources.memory_gb 1.5 GB, raised once already after an earlier out-of-memory; give the job more memory and resubmit"
            ],
        );
    }

    #[test]
    fn a_whole_device_or_a_request_that_fits_nowhere_fails_at_once() {
        let whole = report(7 * GB, 8 * GB, Some(Phase::Eval));
        check(
            0.0,
            0,
            Some(&whole),
            8.0,
            expect![
                "fail: out of memory on cpu:0 in the eval phase (peak 7.00 GB, cap 8.00 GB); it had the whole device (resources.memory_gb = 0): there is no larger request to make"
            ],
        );
        let big = report(6 * GB, 6 * GB, Some(Phase::Update));
        check(
            6.0,
            0,
            Some(&big),
            8.0,
            expect![
                "fail: out of memory on cpu:0 in the update phase (peak 6.00 GB, cap 6.00 GB), with resources.memory_gb 6 GB; the larger request of 9 GB fits no device here: no device has 9 GB (cpu:0 8 GB)"
            ],
        );
    }

    /// A peak just past the cap does not read as equal to it.
    #[test]
    fn a_peak_past_the_cap_reads_as_more() {
        let cap = 6 * GB / 5;
        let cases = [
            (cap + GB / 50, Some(cap), "1.22 GB", "1.20 GB"),
            (cap + GB / 500, Some(cap), "1.202 GB", "1.200 GB"),
            (cap + 1, Some(cap), "1.2000 GB", "1.2000 GB"),
            (cap, Some(cap), "1.20 GB", "1.20 GB"),
            (cap, None, "1.20 GB", "none"),
        ];
        for (peak, cap, peak_text, cap_text) in cases {
            assert_eq!(
                peak_and_cap(peak, cap),
                (peak_text.to_owned(), cap_text.to_owned()),
                "{peak} {cap:?}"
            );
        }
    }

    #[test]
    fn larger_requests_round_up_to_a_tenth() {
        let cases = [
            (1.0, None, 1.5),
            (0.7, None, 1.1),
            (0.05, None, 0.1),
            (2.2, None, 3.3),
            (1.0, Some(2 * GB), 2.4),
            (1.0, Some(GB), 1.5),
            (0.0001, None, 0.1),
        ];
        for (memory_gb, peak, expected) in cases {
            assert_eq!(larger_request(memory_gb, peak), expected, "{memory_gb} GB, peak {peak:?}");
        }
        for (resident, memory, larger, expected) in
            [(0.6, 1.2, 1.8, 0.9), (0.55, 1.0, 1.5, 0.9), (1.0, 1.0, 1.5, 1.5), (0.01, 1.0, 3.0, 0.1)]
        {
            assert_eq!(
                grown_resident(resident, memory, larger),
                expected,
                "{resident} of {memory} → {larger}"
            );
        }
    }
}
