//! The machine's parameters (CODA §5): stacks, near-data SMs, memory, the fine-grain
//! chunk and the bandwidths of the three kinds of path. Experiments print them.

use core::fmt;
use gmem_core::{PhysAddr, PAGE_SIZE};

/// One HBM-stack system.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HbmConfig {
    /// Memory stacks (a power of two, at least 2).
    pub stacks: u32,
    /// Near-data SMs in each stack.
    pub sms_per_stack: u32,
    /// Bytes of each stack (a multiple of 4 KiB).
    pub stack_bytes: u64,
    /// The first physical address of the stacks' memory (4 KiB × `stacks` aligned).
    pub base: PhysAddr,
    /// Bytes a fine-grain page keeps in one stack before moving to the next (a power
    /// of two dividing 4 KiB / `stacks`).
    pub fine_chunk: u64,
    /// Bandwidth of an SM to its own stack, GB/s.
    pub local_gbps: f64,
    /// Bandwidth of the host to the stacks, GB/s.
    pub host_gbps: f64,
    /// Bandwidth between stacks, GB/s.
    pub remote_gbps: f64,
}

impl Default for HbmConfig {
    /// Four stacks of four SMs, 16 MiB each at 1 GiB, 128-byte fine-grain chunks, 256 /
    /// 128 / 16 GB/s (CODA §5).
    fn default() -> Self {
        HbmConfig {
            stacks: 4,
            sms_per_stack: 4,
            stack_bytes: 16 << 20,
            base: PhysAddr::new(1 << 30),
            fine_chunk: 128,
            local_gbps: 256.0,
            host_gbps: 128.0,
            remote_gbps: 16.0,
        }
    }
}

/// Why a configuration is unusable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// Stacks not a power of two of at least 2.
    Stacks(u32),
    /// The fine-grain chunk is not a power of two that divides a page among the stacks.
    Chunk(u64),
    /// Stack size or base not aligned (4 KiB per stack, a page group at the base).
    Alignment,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Stacks(n) => write!(f, "{n} stacks: need a power of two >= 2"),
            ConfigError::Chunk(c) => write!(f, "fine-grain chunk {c} does not divide a page"),
            ConfigError::Alignment => write!(f, "stack size or base not aligned"),
        }
    }
}

impl core::error::Error for ConfigError {}

impl HbmConfig {
    /// Check the parameters.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.stacks < 2 || !self.stacks.is_power_of_two() {
            return Err(ConfigError::Stacks(self.stacks));
        }
        let per_stack = PAGE_SIZE / u64::from(self.stacks);
        if !self.fine_chunk.is_power_of_two() || self.fine_chunk > per_stack {
            return Err(ConfigError::Chunk(self.fine_chunk));
        }
        if self.stack_bytes == 0
            || self.stack_bytes % PAGE_SIZE != 0
            || self.base.as_u64() % self.group_bytes() != 0
        {
            return Err(ConfigError::Alignment);
        }
        Ok(())
    }

    /// Frames of a page group: one per stack.
    pub fn group_frames(&self) -> u64 {
        u64::from(self.stacks)
    }

    /// `log2` of [`HbmConfig::group_frames`] (the core's page-group order).
    pub fn group_order(&self) -> u32 {
        self.stacks.trailing_zeros()
    }

    /// Bytes of a page group.
    pub fn group_bytes(&self) -> u64 {
        self.group_frames() * PAGE_SIZE
    }

    /// Bytes of the whole memory.
    pub fn total_bytes(&self) -> u64 {
        self.stack_bytes * u64::from(self.stacks)
    }

    /// One past the last physical address.
    pub fn end(&self) -> PhysAddr {
        PhysAddr::new(self.base.as_u64() + self.total_bytes())
    }

    /// SMs of the machine.
    pub fn sms(&self) -> u32 {
        self.stacks * self.sms_per_stack
    }

    /// The stack SM `sm` sits in.
    pub fn stack_of_sm(&self, sm: u32) -> u32 {
        sm / self.sms_per_stack
    }
}

impl fmt::Display for HbmConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} stacks x {} SMs, {} MiB/stack, fine-grain chunk {} B, local {} GB/s, host {} GB/s, remote {} GB/s",
            self.stacks,
            self.sms_per_stack,
            self.stack_bytes >> 20,
            self.fine_chunk,
            self.local_gbps,
            self.host_gbps,
            self.remote_gbps
        )
    }
}
