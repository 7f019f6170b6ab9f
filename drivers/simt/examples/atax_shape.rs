//! Whether ATAX's shared-TLB hit ratio is a step against TLB reach: ATAX's two kernels
//! (`tmp = A x`, a row per thread; `y = Aᵀ tmp`, a column per thread) launched on
//! their own at three matrix sizes, under both warp schedulers (loose round-robin,
//! greedy-then-oldest), both block dispatchers (round-robin, greedy) and two block
//! sizes, on the MESC geometry (16 CUs, 32-entry L1s, 512-entry shared TLB). Prints
//! each kernel's requests, per-CU L1 hit ratio and shared-TLB hit ratio per lookup,
//! and both kernels together (merged misses count as misses). Nothing is tuned: the
//! model and its TLBs are the ones every workload uses. Untimed, the row kernel hit
//! 0.998 at n = 512 and 0.02-0.03 from n = 1024 (each row's page came back only after
//! n other pages); with timed walks (the engine's default) it hits 0.95-0.97 at
//! n = 1024 and 2048 under every scheduler, dispatcher and block size here, because
//! warps whose walks finished run ahead of those still queued for a walker.
//!
//! `cargo run --release -p gmem-simt --example atax_shape`

use gmem_simt::dispatch::{Dispatch, Greedy, Gto, LooseRoundRobin, RoundRobin, WarpScheduler};
use gmem_simt::machine::SimtMachine;
use gmem_simt::workloads::spec::SpecKernel;
use gmem_simt::workloads::MatVec;

fn main() {
    for n in [512u64, 1024, 2048] {
        for (sname, gto) in [("lrr", false), ("gto", true)] {
            for (dname, greedy) in [("rr", false), ("greedy", true)] {
                for tpb in [256u32, 64] {
                    let m = SimtMachine::mesc(n * n / 1024 + 64).unwrap();
                    let a = m.upload_f32(&vec![1.0; (n * n) as usize]).unwrap();
                    let v = m.upload_f32(&vec![1.0; n as usize]).unwrap();
                    let o = m.alloc(n * 4).unwrap();
                    let mut line = format!("n={n} sched={sname} dispatch={dname} tpb={tpb}");
                    let mut tot = (0u64, 0u64, 0u64);
                    for rows in [true, false] {
                        let mut k = SpecKernel::new(MatVec {
                            n,
                            a: a.start.as_u64(),
                            v: v.start.as_u64(),
                            out: o.start.as_u64(),
                            rows,
                        });
                        k.threads_per_block = tpb;
                        let sch: &dyn Fn() -> Box<dyn WarpScheduler> = if gto {
                            &|| Box::new(Gto::default())
                        } else {
                            &|| Box::new(LooseRoundRobin::default())
                        };
                        let mut rr = RoundRobin::default();
                        let mut g = Greedy;
                        let d: &mut dyn Dispatch = if greedy { &mut g } else { &mut rr };
                        let s = m.launch_with(&k, d, sch).unwrap();
                        // A and v are all ones: every output is n.
                        let got = m.download_f32(o, n as usize).unwrap();
                        assert!(got.iter().all(|&x| x == n as f32), "wrong result");
                        let l1 = s.served_l1 as f64 / s.translations as f64;
                        let sh = s.served_l2 as f64 / (s.translations - s.served_l1) as f64;
                        line += &format!(
                            " | {} req={} L1={:.3} shared={:.3} wpu={}",
                            if rows { "rows" } else { "cols" },
                            s.translations,
                            l1,
                            sh,
                            s.warps_per_unit
                        );
                        tot.0 += s.translations;
                        tot.1 += s.served_l1;
                        tot.2 += s.served_l2;
                    }
                    line += &format!(
                        " | both L1={:.3} shared={:.3}",
                        tot.1 as f64 / tot.0 as f64,
                        tot.2 as f64 / (tot.0 - tot.1) as f64
                    );
                    println!("{line}");
                }
            }
        }
    }
}
