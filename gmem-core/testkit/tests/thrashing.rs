//! The KPI runner follows thrashing detection (issue 35, item 3; `Op::Thrashing`,
//! `Op::ExpirePins`, `Op::PingPong`): seeded sequences that open with a ping-pong of
//! pages between the host and the discrete GPU under detection (the seed chooses
//! the mitigation, the pin time and which turns load, store or call `dev_fault`), use
//! a dead space handle on both calls, and go on with whatever the seed decodes into.
//! Every operation is checked by the runner as usual (bytes read through every
//! device against the model, `check_invariants`, a `Throttled` fault changes
//! nothing); the test checks the detector acted: pins (or throttles) happened, and
//! pins expired. A runner whose thrashing op did nothing fails it.

use gmem_testkit::kpi::{MitigationSel, Op, Setup, ThrashSel};
use gmem_testkit::{replay_kpi_after, Summary};

const HOST: u8 = 0;
const DGPU: u8 = 1;

/// Detection on in the first space (threshold 1, lapse 8 ticks, nap 2, pin time
/// `pin_time` ticks of the migration clock), then the host and the discrete GPU
/// take turns on six pages of the first two regions, pins expiring after each; a
/// dead space handle on both calls; detection off and on again.
fn ping_pong(mitigation: MitigationSel, pin_time: u8, loads: u8, faults: u8) -> Vec<Op> {
    let on = Op::Thrashing {
        space: 0,
        config: Some(ThrashSel {
            threshold: 0,
            lapse: 7,
            nap: 1,
            pin_time,
            mitigation,
        }),
        stale: false,
    };
    let mut ops = vec![on];
    for k in 0..6u8 {
        ops.push(Op::PingPong {
            a: HOST,
            b: DGPU,
            region: u16::from(k / 3),
            page: k,
            rounds: 10,
            loads,
            faults,
            seed: k,
        });
        ops.push(Op::ExpirePins {
            space: 0,
            stale: false,
        });
    }
    // A second space, destroyed: its handle is stale for both calls.
    ops.push(Op::CreateSpace {
        large: false,
        policy: gmem_testkit::kpi::PolicySel {
            fit: 0,
            guarded: false,
            cached: false,
        },
    });
    ops.push(Op::DestroySpace { space: 1 });
    ops.push(Op::Thrashing {
        space: 0,
        config: None,
        stale: true,
    });
    ops.push(Op::ExpirePins {
        space: 0,
        stale: true,
    });
    // Off (every pin ends), bytes checked through both devices, on again.
    ops.push(Op::Thrashing {
        space: 0,
        config: None,
        stale: false,
    });
    for dev in [HOST, DGPU] {
        for region in 0..2 {
            ops.push(Op::Verify { dev, region });
        }
    }
    ops.push(on);
    ops
}

#[test]
fn kpi_runner_follows_pins_and_throttles_of_a_ping_pong_then_seeded_operations() {
    let mut total = Summary::default();
    for seed in 0..48u64 {
        let mitigation = match seed % 3 {
            0 => MitigationSel::Pin,
            1 => MitigationSel::Throttle,
            _ => MitigationSel::ThrottleThenPin(seed as u8 / 3),
        };
        let pins = !matches!(mitigation, MitigationSel::Throttle);
        // Pin times 1..=15 ticks (0, pinned until detection goes off, in one seed
        // in eight).
        let pin_time = if seed % 8 == 7 {
            0
        } else {
            1 + seed as u8 % 15
        };
        let (loads, faults) = ((seed * 37) as u8, ((seed * 101) >> 2) as u8);
        // The discrete GPU holds the six pages and a few more.
        let tweak = |setup: &mut Setup| setup.dev_pages = setup.dev_pages.max(8);
        let s = replay_kpi_after(seed, tweak, ping_pong(mitigation, pin_time, loads, faults));
        // The detector acted on the ping-pong: the mitigation chosen happened.
        if pins {
            assert!(s.thrashing_pins > 0, "seed {seed}: no pin: {s:?}");
        } else {
            assert!(
                s.thrashing_pins == 0 && s.thrashing_throttles > 0,
                "seed {seed}: {s:?}"
            );
        }
        total += s;
    }
    eprintln!("{total:?}");
    // Faults answered `Throttled` (checked to change nothing), and pins that ended
    // on `as_expire_pins`.
    assert!(total.throttled > 0 && total.pins_expired > 0, "{total:?}");
}
