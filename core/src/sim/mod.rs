//! Trace-driven simulators. Pure: inputs are parsed values, outputs are data;
//! the binaries read files, run experiments on threads and write results.

pub mod allocation;
pub mod placement;
pub mod serving;
pub mod synthetic;
pub mod variant;

pub use allocation::{
    csv_header, csv_row, discrete_curve, mean_of, paper_label, CurveDeviation, ExpectedRow,
    ExpectedTable, ExpectedTableError, ARRIVED_COLUMNS,
};
pub use placement::{run_experiment, ExperimentResult, PlacementEvent, Workload};
