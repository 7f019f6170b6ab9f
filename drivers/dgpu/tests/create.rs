//! `Dgpu::create` leaves nothing behind when it fails: a GPU whose video memory
//! overlaps memory already in the machine's map is refused, and once that memory is
//! gone the same GPU is created (its port, codec and map entry were never kept).

use gmem_dgpu::{Dgpu, DgpuConfig, DgpuError};
use gmem_host_cpu::{HostCpu, HostCpuConfig};
use gmem_sim::MapError;

#[test]
fn a_refused_create_leaves_the_gpu_creatable() {
    let (gm, cpu) = HostCpu::boot(HostCpuConfig::default()).unwrap();
    let map = cpu.memory_map().clone();
    // Two GPUs with the same instance number: the same video-memory range.
    let first = Dgpu::new(map.clone(), DgpuConfig::new(0, 4 << 20, 2)).unwrap();
    let second = Dgpu::new(map.clone(), DgpuConfig::new(0, 4 << 20, 2)).unwrap();
    let a = first.create(&gm, "first").unwrap();
    let frames_before = gm.dev_frames(a).unwrap();
    match second.create(&gm, "second") {
        Err(DgpuError::Map(MapError::Overlaps(d))) => assert_eq!(d, a),
        other => panic!("expected an overlap with the first GPU, got {other:?}"),
    }
    assert_eq!(second.id(), None, "the port stays unbound");
    assert_eq!(gm.dev_frames(a).unwrap(), frames_before);
    assert!(matches!(
        first.create(&gm, "again"),
        Err(DgpuError::AlreadyCreated(d)) if d == a
    ));
    // Remove the first GPU and its memory: the second is created, bound and mapped.
    map.remove(a).unwrap();
    gm.dev_destroy(a).unwrap();
    let b = second.create(&gm, "second").unwrap();
    assert_eq!(second.id(), Some(b));
    assert_eq!(map.at(second.vram().base()).map(|(d, _)| d), Some(b));
    assert!(gm.dev_frames(b).unwrap().registered > 0);
}
