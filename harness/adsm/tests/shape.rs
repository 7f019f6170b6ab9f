//! Every workload under every protocol and the baseline, at tiny sizes: bit-exact, the
//! GPU (which cannot fault) never faults, allocation stays outside the window.

use gmem_adsm::workloads::{run_one, Sizes, Variant, Workload};
use gmem_adsm::{Protocol, TimeModel};

#[test]
fn every_workload_is_bit_exact_under_every_protocol_and_the_gpu_never_faults() {
    let s = Sizes::tiny();
    let variants = [
        Variant::Explicit,
        Variant::Adsm(Protocol::Batch),
        Variant::Adsm(Protocol::Lazy),
        Variant::Adsm(Protocol::Rolling {
            block: 16 << 10,
            rolling: 2,
        }),
        Variant::Adsm(Protocol::Rolling {
            block: 4 << 10,
            rolling: 1,
        }),
    ];
    for w in Workload::ALL {
        for v in variants {
            let r = run_one(w, v, &s, TimeModel::default()).unwrap();
            eprintln!("{:9} {:8} {:?}", w.name(), v.name(), r.measured);
            assert!(r.verified, "{} under {}", w.name(), v.name());
            assert_eq!(r.measured.gpu_faults, 0, "{} under {}", w.name(), v.name());
            assert_eq!(r.measured.zeroed, 0);
            if v == Variant::Explicit || v == Variant::Adsm(Protocol::Batch) {
                assert_eq!(r.measured.cpu_faults, 0);
            }
        }
    }
}
