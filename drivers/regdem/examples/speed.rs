use gmem_regdem::kernels::Bench;
use gmem_regdem::sim::{simulate, SimConfig};
use gmem_regdem::{interp, SmConfig};
fn main() {
    let sm = SmConfig::maxwell();
    let cfg = SimConfig::maxwell();
    let b = Bench::Sgemm {
        tm: 4,
        tn: 4,
        k: 64,
    };
    let k = b.build(24).unwrap();
    let g0 = interp::init_global(&k, 1);
    let t = std::time::Instant::now();
    let mut g = g0.clone();
    interp::run(&k, &mut g).unwrap();
    println!("interp {:?}", t.elapsed());
    let t = std::time::Instant::now();
    let mut g = g0.clone();
    let s = simulate(&k, &sm, &cfg, &mut g).unwrap();
    println!(
        "sim {:?} {} cycles {} winsts",
        t.elapsed(),
        s.cycles,
        s.warp_insts
    );
}
