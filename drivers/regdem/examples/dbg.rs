use gmem_regdem::demote::{demote, Options};
use gmem_regdem::kernels::Bench;
use gmem_regdem::sim::{simulate, SimConfig};
use gmem_regdem::{interp, SmConfig};
fn main() {
    let sm = SmConfig::maxwell();
    let cfg = SimConfig::maxwell();
    let b = Bench::Nbody {
        unroll: 8,
        tiles: 2,
    };
    let k = b.build(24).unwrap();
    let d = demote(&k, &sm, &Options::local_cap(40)).unwrap();
    let mut g = interp::init_global(&k, 1);
    let s = simulate(&d.kernel, &sm, &cfg, &mut g).unwrap();
    println!("{:?}", s.first_poison);
    let p = s.first_poison.unwrap();
    for (bi, blk) in d.kernel.blocks.iter().enumerate() {
        let n = blk.insts.len();
        for (i, inst) in blk.insts.iter().enumerate() {
            if bi != p.block || i + 12 > n || i < 3 {
                println!(
                    "{bi}{}{:3} {} {:?}",
                    if i == p.inst && bi == p.block {
                        ">"
                    } else {
                        " "
                    },
                    i,
                    inst,
                    inst.origin
                );
            }
        }
    }
}
