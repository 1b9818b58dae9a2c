//! The process runtime driver (in progress).
