//! The dashboard's views.

mod chart;
mod detail;
mod forms;
mod header;
mod question;
mod sign_in;
mod table;

pub use chart::ServerChart;
pub use detail::Detail;
pub use forms::StartForms;
pub use header::Header;
pub use sign_in::SignIn;
pub use table::TaskTable;

use crate::state::Dashboard;

pub(crate) fn dashboard() -> Dashboard {
    leptos::prelude::expect_context::<Dashboard>()
}
