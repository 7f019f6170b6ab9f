use gmem_regdem::kernels::Bench;
use gmem_regdem::sim::SimConfig;
use gmem_regdem::variants::{ablations, evaluate};
use gmem_regdem::SmConfig;
fn main() {
    let sm = SmConfig::maxwell();
    let cfg = SimConfig::maxwell();
    let grid: u32 = std::env::args()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(24);
    for b in [
        Bench::Sgemm {
            tm: 4,
            tn: 4,
            k: 64,
        },
        Bench::Nbody {
            unroll: 8,
            tiles: 2,
        },
        Bench::Stencil {
            outputs: 20,
            tiles: 2,
        },
        Bench::Butterfly { batches: 4 },
    ] {
        let t = std::time::Instant::now();
        let r = evaluate(b, grid, 1, &sm, &cfg).unwrap();
        for row in &r.rows {
            println!(
                "{:12} {:22} regs {:3} smem {:6} warps {:2} cycles {:8} x{:.3} pred {:10.0} ok {}",
                row.kernel,
                row.variant,
                row.registers,
                row.shared_bytes,
                row.warps,
                row.cycles,
                row.speedup,
                row.predicted_cycles,
                row.verified
            );
        }
        println!(
            "  predicted {} ({:.3}) best {} ({:.3}) ref {} [{:?}]",
            r.predicted_best,
            r.predicted_speedup,
            r.exhaustive_best,
            r.best_speedup,
            r.reference_ok,
            t.elapsed()
        );
        if let Ok(a) = ablations(b, grid, 1, &sm, &cfg) {
            for x in a {
                println!(
                    "  ablation {:20} regs {} warps {} cycles {} ok {}",
                    x.config, x.registers, x.warps, x.cycles, x.verified
                );
            }
        }
    }
}
