use gmem_regdem::kernels::Bench;
use gmem_regdem::sim::SimConfig;
use gmem_regdem::variants::ablations;
use gmem_regdem::SmConfig;
fn main() {
    let sm = SmConfig::maxwell();
    let cfg = SimConfig::maxwell();
    for grid in [2u32, 4, 12, 30] {
        for b in [
            Bench::SgemmPrefetch {
                tm: 2,
                tn: 4,
                k: 32,
            },
            Bench::SgemmPrefetch {
                tm: 4,
                tn: 4,
                k: 32,
            },
            Bench::SgemmPrefetch {
                tm: 6,
                tn: 4,
                k: 32,
            },
        ] {
            let k = b.build(grid).unwrap();
            match ablations(b, grid, 1, &sm, &cfg) {
                Ok(a) => println!(
                    "grid {grid} {:10} r{} {}",
                    b.name(),
                    k.registers(),
                    a.iter()
                        .map(|x| format!("{}={}/{}", x.config, x.cycles, x.registers))
                        .collect::<Vec<_>>()
                        .join(" ")
                ),
                Err(e) => println!("grid {grid} {:10} r{} {e}", b.name(), k.registers()),
            }
        }
    }
}
