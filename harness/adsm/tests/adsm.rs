//! The "must hold" list: a runtime that forgets to release is caught; a 1-byte
//! write into a 64 MiB object moves the whole object under lazy and one block under
//! rolling; the dirty FIFO never exceeds the rolling size; a write after an eager flush
//! re-dirties the block; bytes and DMAs are the copy engine's; the GPU cannot fault and
//! never does; §4.2's safe allocation; misuse is typed and changes nothing.

use gmem_adsm::runtime::BlockState;
use gmem_adsm::workloads::{self, machine, Sizes, Workload};
use gmem_adsm::{Adsm, AdsmError, Explicit, Machine, MachineConfig, Program, Protocol, TimeModel};
use gmem_core::{DevCaps, FaultError, VirtAddr, PAGE_SIZE};
use gmem_sim::{AccessError, Grid};
use std::cell::Cell;

fn adsm(p: Protocol) -> Adsm {
    Adsm::new(machine().unwrap(), p, TimeModel::default()).unwrap()
}

fn rolling(block: u64, rolling: usize) -> Protocol {
    Protocol::Rolling { block, rolling }
}

fn va(base: VirtAddr, off: u64) -> VirtAddr {
    VirtAddr::new(base.as_u64() + off)
}

/// Call a one-item kernel that loads the byte at `at` (a device address); sync.
fn device_byte(p: &mut dyn Program, at: VirtAddr) -> u8 {
    let seen = Cell::new(0u8);
    p.call(Grid::covering(1, 1), &mut |w| {
        let mut b = [0u8; 1];
        w.load(at, &mut b)?;
        seen.set(b[0]);
        Ok(())
    })
    .unwrap();
    p.sync().unwrap();
    seen.get()
}

#[test]
fn a_runtime_that_forgets_to_release_makes_the_device_read_stale_data() {
    let s = Sizes::tiny();
    for proto in [Protocol::Batch, Protocol::Lazy, rolling(16 << 10, 2)] {
        let mut good = adsm(proto);
        assert!(workloads::run(Workload::VecAdd, &mut good, &s).unwrap());
        let mut broken = adsm(proto).with_forgotten_release();
        assert!(
            !workloads::run(Workload::VecAdd, &mut broken, &s).unwrap(),
            "{proto:?}: the stale read must be caught"
        );
    }
    // Rolling's eager flushes send most blocks anyway; what is left at call is stale.
    let mut broken = adsm(rolling(4 << 10, 2)).with_forgotten_release();
    let p = broken.alloc(4 * PAGE_SIZE).unwrap();
    broken.store(p, &[7]).unwrap();
    assert_eq!(device_byte(&mut broken, p), 0, "never released: stale zero");
}

#[test]
fn one_byte_into_64_mib_moves_the_object_under_lazy_and_one_block_under_rolling() {
    const SIZE: u64 = 64 << 20;
    const BLOCK: u64 = 256 << 10;
    let cfg = MachineConfig::new(256 << 20, 256 << 20);
    for (proto, want) in [(Protocol::Lazy, SIZE), (rolling(BLOCK, 4), BLOCK)] {
        let mut rt = Adsm::new(Machine::new(cfg).unwrap(), proto, TimeModel::default()).unwrap();
        let p = rt.alloc(SIZE).unwrap();
        rt.begin();
        let at = va(p, 10 << 20 | 123);
        rt.store(at, &[0xab]).unwrap();
        assert_eq!(device_byte(&mut rt, at), 0xab, "{proto:?}");
        let m = rt.measure();
        assert_eq!(m.bytes_h2d, want, "{proto:?}");
        assert_eq!(m.bytes_d2h, 0);
        assert_eq!(m.cpu_faults, 1);
        assert_eq!(m.gpu_faults, 0);
    }
}

#[test]
fn the_dirty_fifo_never_exceeds_the_rolling_size() {
    for cap in [1usize, 3, 8] {
        let mut rt = adsm(rolling(PAGE_SIZE, cap));
        let p = rt.alloc(40 * PAGE_SIZE).unwrap();
        rt.begin();
        for k in 0..40 {
            rt.store(va(p, k * PAGE_SIZE + 5), &[k as u8 + 1]).unwrap();
            assert!(rt.fifo_len() <= cap);
        }
        let m = rt.measure();
        assert_eq!(m.max_fifo, cap);
        assert_eq!(m.eager_flushes, 40 - cap as u64);
        // The eager flushes already moved those blocks, in the background.
        assert_eq!(m.bytes_h2d, (40 - cap as u64) * PAGE_SIZE);
        assert!(m.breakdown.dma_h2d > 0.0);
        for k in 0..40 {
            assert_eq!(device_byte(&mut rt, va(p, k * PAGE_SIZE + 5)), k as u8 + 1);
        }
    }
}

#[test]
fn a_cpu_write_after_an_eager_flush_re_dirties_the_block() {
    let mut rt = adsm(rolling(PAGE_SIZE, 1));
    let p = rt.alloc(3 * PAGE_SIZE).unwrap();
    rt.begin();
    rt.store(p, &[1]).unwrap();
    assert_eq!(rt.state_at(p), Some(BlockState::Dirty));
    rt.store(va(p, PAGE_SIZE), &[2]).unwrap(); // pushes block 0 out
    assert_eq!(rt.state_at(p), Some(BlockState::ReadOnly));
    assert_eq!(rt.measure().eager_flushes, 1);
    let faults = rt.measure().cpu_faults;
    rt.store(p, &[3]).unwrap(); // faults: read-only again after its flush
    assert_eq!(rt.measure().cpu_faults, faults + 1);
    assert_eq!(rt.state_at(p), Some(BlockState::Dirty));
    assert_eq!(device_byte(&mut rt, p), 3, "the new value was released");
    // After the call every block is invalid; a read fetches exactly one block.
    let before = rt.measure().bytes_d2h;
    let mut b = [0u8];
    rt.load(va(p, PAGE_SIZE), &mut b).unwrap();
    assert_eq!(b, [2]);
    assert_eq!(rt.state_at(va(p, PAGE_SIZE)), Some(BlockState::ReadOnly));
    assert_eq!(rt.state_at(p), Some(BlockState::Invalid));
    assert_eq!(rt.measure().bytes_d2h - before, PAGE_SIZE);
}

#[test]
fn bytes_and_dmas_are_the_copy_engines_counts() {
    for proto in [Protocol::Batch, Protocol::Lazy, rolling(8 << 10, 2)] {
        let mut rt = adsm(proto);
        let a = rt.alloc(64 << 10).unwrap();
        let b = rt.alloc(64 << 10).unwrap();
        rt.begin();
        let engine_before = rt.machine().gpu.dma().stats();
        rt.store(a, &[9; 64 << 10]).unwrap();
        let _ = device_byte(&mut rt, b);
        let mut out = [0u8; 100];
        rt.load(va(b, 4096), &mut out).unwrap();
        let engine = rt.machine().gpu.dma().stats();
        let m = rt.measure();
        assert_eq!(
            m.bytes_h2d,
            engine.host_to_device - engine_before.host_to_device
        );
        assert_eq!(
            m.bytes_d2h,
            engine.device_to_host - engine_before.device_to_host
        );
        assert_eq!(m.dmas, engine.transfers - engine_before.transfers);
        assert!(m.dmas > 0 && m.bytes_h2d >= 64 << 10, "{proto:?}: {m:?}");
        // And the time model charged DMA time for exactly those transfers.
        let tm = TimeModel::default();
        let busy = m.breakdown.dma_h2d + m.breakdown.dma_d2h;
        let want = m.dmas as f64 * tm.dma_setup_ns
            + (m.bytes_h2d + m.bytes_d2h) as f64 / tm.bus_bytes_per_s * 1e9;
        assert!((busy - want).abs() < 1e-3, "{busy} vs {want}");
    }
}

#[test]
fn the_gpu_cannot_fault_and_never_does() {
    let mut rt = adsm(Protocol::Lazy);
    let (gpu, gm) = (rt.machine().gpu_id, &rt.machine().gm);
    assert!(!gm.dev_caps(gpu).unwrap().contains(DevCaps::FAULTABLE));
    // Through whole workloads it touches only its private frames: no fault at all.
    assert!(workloads::run(Workload::Atax, &mut rt, &Sizes::tiny()).unwrap());
    assert_eq!(rt.measure().gpu_faults, 0);
    assert_eq!(rt.machine().gpu.stats().port.faults, 0);
    rt.machine()
        .gm
        .check_invariants(rt.machine().space)
        .unwrap();
    // A safe object's CPU address is not the device's: a kernel using it is refused
    // by the core (the device cannot fault), it is not served.
    let p = rt.safe_alloc(PAGE_SIZE).unwrap();
    let err = rt
        .call(Grid::covering(1, 1), &mut |w| w.load_u32(p).map(|_| ()))
        .unwrap_err();
    assert!(
        matches!(
            err,
            AdsmError::Launch(ref e) if matches!(e.error, AccessError::Fault { error: FaultError::NotFaultable(_), .. })
        ),
        "{err:?}"
    );
    assert_eq!(rt.machine().gpu.stats().port.zero_fills, 0);
    assert_eq!(rt.machine().gpu.stats().port.migrations, 0);
}

#[test]
fn safe_alloc_gives_the_device_a_second_address() {
    for proto in [Protocol::Batch, Protocol::Lazy, rolling(PAGE_SIZE, 1)] {
        let mut rt = adsm(proto);
        let p = rt.safe_alloc(2 * PAGE_SIZE).unwrap();
        let d = rt.safe(va(p, PAGE_SIZE + 1)).unwrap();
        assert_ne!(d, va(p, PAGE_SIZE + 1));
        assert_eq!(rt.safe(p).unwrap().as_u64() + PAGE_SIZE + 1, d.as_u64());
        rt.store(va(p, PAGE_SIZE + 1), &[42]).unwrap();
        assert_eq!(device_byte(&mut rt, d), 42, "{proto:?}");
        // The device writes through its address; the CPU reads through its own.
        rt.call(Grid::covering(1, 1), &mut |w| w.store(d, &[43]))
            .unwrap();
        rt.sync().unwrap();
        let mut b = [0u8];
        rt.load(va(p, PAGE_SIZE + 1), &mut b).unwrap();
        assert_eq!(b, [43], "{proto:?}");
        assert_eq!(
            rt.safe(VirtAddr::new(1 << 20)),
            Err(AdsmError::NotAnObject(VirtAddr::new(1 << 20)))
        );
        rt.free(p).unwrap();
        rt.machine()
            .gm
            .check_invariants(rt.machine().space)
            .unwrap();
    }
}

#[test]
fn misuse_is_typed_and_changes_nothing() {
    assert!(matches!(
        Adsm::new(machine().unwrap(), rolling(100, 2), TimeModel::default()),
        Err(AdsmError::BadArgument(_))
    ));
    assert!(matches!(
        Adsm::new(
            machine().unwrap(),
            rolling(PAGE_SIZE, 0),
            TimeModel::default()
        ),
        Err(AdsmError::BadArgument(_))
    ));
    let mut rt = adsm(Protocol::Lazy);
    assert!(matches!(rt.alloc(0), Err(AdsmError::BadArgument(_))));
    assert_eq!(rt.sync(), Err(AdsmError::NotRunning));
    let p = rt.alloc(PAGE_SIZE).unwrap();
    rt.store(p, &[5]).unwrap();
    rt.call(Grid::covering(1, 1), &mut |_| Ok(())).unwrap();
    // Between call and sync the object is the device's.
    assert_eq!(rt.store(p, &[6]), Err(AdsmError::KernelRunning));
    let mut b = [0u8];
    assert_eq!(rt.load(p, &mut b), Err(AdsmError::KernelRunning));
    assert_eq!(rt.free(p), Err(AdsmError::KernelRunning));
    assert_eq!(
        rt.call(Grid::covering(1, 1), &mut |_| Ok(())),
        Err(AdsmError::KernelRunning)
    );
    rt.sync().unwrap();
    rt.load(p, &mut b).unwrap();
    assert_eq!(b, [5]);
    assert_eq!(rt.free(va(p, 8)), Err(AdsmError::NotAnObject(va(p, 8))));
    rt.free(p).unwrap();
    // A freed object's pages are gone: the CPU access is a real segfault.
    assert!(matches!(rt.store(p, &[1]), Err(AdsmError::Access(_))));
    // The baseline: the device buffer is not the CPU's.
    let mut ex = Explicit::new(machine().unwrap(), TimeModel::default());
    let buf = ex.alloc(PAGE_SIZE).unwrap();
    assert!(matches!(ex.store(buf.dev, &[1]), Err(AdsmError::Access(_))));
    ex.store(buf.host, &[1]).unwrap();
}
