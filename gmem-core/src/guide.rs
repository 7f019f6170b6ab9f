//! The embedding guide (placeholder).
