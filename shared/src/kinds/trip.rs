//! Trip planning: a task that stops twice to ask its person (which hotel, then whether to
//! book), waiting as `input_required` for as long as it takes.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{KindSpec, ParamError, check_length, check_range};
use crate::results::TripResult;

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct TripParams {
    /// Where to go.
    #[schemars(title = "Destination", length(min = 1, max = 100), example = &"Lisbon")]
    pub destination: String,
    /// The first night, as YYYY-MM-DD.
    #[schemars(title = "Check-in date", example = &"2027-05-14")]
    pub start_date: String,
    /// How many nights to stay.
    #[serde(default = "default_nights")]
    #[schemars(title = "Nights", range(min = 1, max = 60))]
    pub nights: u32,
    /// What the stay may cost in all, in euros.
    #[schemars(title = "Budget (EUR)", range(min = 1, max = 1_000_000), example = 900)]
    pub budget: u64,
}

fn default_nights() -> u32 {
    3
}

/// The question of a trip's first stop: which hotel.
pub const CHOOSE_HOTEL: &str = "choose_hotel";
/// The question of a trip's second stop: book it or not.
pub const CONFIRM_BOOKING: &str = "confirm_booking";

pub struct TripPlanning;

impl KindSpec for TripPlanning {
    const NAME: &'static str = "trip_planning";
    const TITLE: &'static str = "Trip planning";
    const DESCRIPTION: &'static str = "Start planning a trip to destination from start_date for \
        nights nights within budget euros. The task finds hotels, then waits (status \
        input_required, for as long as it takes, across restarts) for you to choose one and \
        to confirm the booking: answer with answer_task, or through elicitation when your \
        client supports it. Returns a task://status/{task_id} link at once; the result holds \
        the booking.";
    const RESULT: &'static str = "the booking (or why none was made)";
    type Params = TripParams;
    type Output = TripResult;

    fn validate(params: &TripParams) -> Result<(), ParamError> {
        check_length("destination", params.destination.trim(), 1, 100)?;
        if chrono::NaiveDate::parse_from_str(&params.start_date, "%Y-%m-%d").is_err() {
            return Err(ParamError::new(
                "start_date",
                format!(
                    "start_date must be a date as YYYY-MM-DD, got {:?}",
                    params.start_date
                ),
            ));
        }
        check_range("nights", params.nights, 1, 60)?;
        check_range("budget", params.budget, 1, 1_000_000)
    }
}
