//! An access racing a migration never touches the old frame: the migration's
//! invalidation waits for the access in flight (between its translation and its bytes).
//!
//! Against the old port (look the frame up, release every lock, then move bytes) the
//! store below lands in the frame the migration already copied and freed, and the host
//! reads the old value: this test fails there.

use gmem_core::{Prot, VirtAddr};
use gmem_sim::{AccessGate, Leaf, Miss, Served, Translator};
use gmem_simt::machine::{mesc_tlbs, GpuKind, SimtMachine};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Translates through the GPU's MMU; once armed, stops after the translation until
/// told to go (or a timeout passes).
struct Pausing {
    inner: Arc<dyn Translator>,
    armed: AtomicBool,
    reached: Mutex<Sender<()>>,
    go: Mutex<Receiver<()>>,
}

impl Translator for Pausing {
    fn translate(&self, unit: usize, va: VirtAddr, access: Prot) -> Result<Leaf, Miss> {
        self.translate_served(unit, va, access).0
    }
    fn translate_served(
        &self,
        unit: usize,
        va: VirtAddr,
        access: Prot,
    ) -> (Result<Leaf, Miss>, Served) {
        let r = self.inner.translate_served(unit, va, access);
        if r.0.is_ok() && self.armed.swap(false, Ordering::SeqCst) {
            self.reached.lock().unwrap().send(()).unwrap();
            let _ = self
                .go
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_millis(400));
        }
        r
    }
    fn units(&self) -> usize {
        self.inner.units()
    }
    fn gate(&self) -> Option<&AccessGate> {
        self.inner.gate()
    }
}

#[test]
fn a_store_racing_a_migration_reaches_the_new_frame() {
    let m = SimtMachine::new(4096, GpuKind::Discrete { pages: 1024 }, mesc_tlbs(2)).unwrap();
    let r = m.alloc(4 * 4096).unwrap();
    let va = r.start;
    // The GPU's first touch places the page in video memory.
    m.port().store_u32(m.gm(), 0, va, 1).unwrap();
    let (reached_tx, reached_rx) = channel();
    let (go_tx, go_rx) = channel();
    let port = m
        .port_through(|mmu| {
            Arc::new(Pausing {
                inner: mmu,
                armed: AtomicBool::new(true),
                reached: Mutex::new(reached_tx),
                go: Mutex::new(go_rx),
            })
        })
        .unwrap();
    std::thread::scope(|s| {
        let store = s.spawn(|| port.store_u32(m.gm(), 0, va, 7));
        reached_rx.recv().unwrap();
        // The store holds a translation to the video-memory frame; move the page home.
        let moved = m
            .gm()
            .region_migrate(r, m.gm().host(), gmem_core::MigrateScope::Populated)
            .unwrap();
        assert_eq!(moved, 1);
        let _ = go_tx.send(());
        store.join().unwrap().unwrap();
    });
    assert_eq!(
        m.cpu().load_u32(m.gm(), va).unwrap(),
        7,
        "the racing store was lost in the old frame"
    );
}
