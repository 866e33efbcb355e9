//! `start_trip_planning`: finds hotels for a stay, asks its person which one, prices the stay,
//! asks whether to book it, and books. Each question is a [`Step::Ask`]: the task waits as
//! `input_required` with no worker, and [`TaskKind::answer`] folds the answer into the
//! checkpoint, so an answer is applied once however often it is sent or the server restarts.

use durable_shared::kinds::{CHOOSE_HOTEL, CONFIRM_BOOKING, ParamError, TripParams, TripPlanning};
use durable_shared::results::TripResult;
use durable_shared::{Question, kinds::parse_params};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{seed_of, splitmix64};
use crate::engine::{Answer, Env, Plan, Step, StepError, TaskKind};

/// Hotels offered for each trip.
const OPTIONS: usize = 3;
const HOTEL_NAMES: [&str; 8] = [
    "Grand Central",
    "Harbour View",
    "Old Town Inn",
    "Garden House",
    "Riverside Lodge",
    "Station Hotel",
    "Hilltop Rooms",
    "Market Square Suites",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hotel {
    pub name: String,
    /// Euros a night.
    pub nightly_rate: u64,
}

/// Where the trip stands: each stage is what the next step does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Find the hotels, then ask which one.
    Search,
    /// Price the chosen hotel, then ask whether to book it.
    Price,
    /// Book the chosen hotel.
    Book,
    /// End without a booking (a question was declined or the booking refused).
    Finish,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TripState {
    stage: Stage,
    options: Vec<Hotel>,
    chosen: Option<usize>,
    answers_applied: u32,
}

/// The answer to [`CHOOSE_HOTEL`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HotelChoice {
    hotel: String,
}

/// The answer to [`CONFIRM_BOOKING`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BookingConfirmation {
    book: bool,
}

/// The hotels of a destination, with rates around what the budget allows a night: the same
/// for the same trip, so a resumed or repeated run offers the same choice.
fn hotels(params: &TripParams) -> Vec<Hotel> {
    let seed = seed_of(&params.destination.trim().to_lowercase());
    let per_night = (params.budget / u64::from(params.nights)).max(1);
    (0..OPTIONS as u64)
        .map(|i| {
            let draw = splitmix64(seed ^ i);
            let name = HOTEL_NAMES[((draw >> 8) as usize + i as usize) % HOTEL_NAMES.len()];
            // 60 % to 140 % of the nightly budget.
            let rate = per_night * (60 + draw % 81) / 100;
            Hotel {
                name: format!("{name} {}", params.destination.trim()),
                nightly_rate: rate.max(1),
            }
        })
        .collect()
}

fn total_cost(params: &TripParams, hotel: &Hotel) -> u64 {
    hotel.nightly_rate * u64::from(params.nights)
}

fn choose_question(params: &TripParams, options: &[Hotel]) -> Question {
    let names: Vec<&str> = options.iter().map(|h| h.name.as_str()).collect();
    let listed: Vec<String> = options
        .iter()
        .map(|h| format!("{} ({} EUR a night)", h.name, h.nightly_rate))
        .collect();
    Question {
        id: CHOOSE_HOTEL.into(),
        message: format!(
            "Which hotel in {} for {} nights from {}? {}",
            params.destination.trim(),
            params.nights,
            params.start_date,
            listed.join(", ")
        ),
        schema: json!({
            "type": "object",
            "properties": {
                "hotel": {
                    "type": "string",
                    "title": "Hotel",
                    "description": "The hotel to stay at",
                    "enum": names,
                }
            },
            "required": ["hotel"],
        }),
    }
}

fn confirm_question(params: &TripParams, hotel: &Hotel) -> Question {
    let cost = total_cost(params, hotel);
    let against_budget = if cost > params.budget {
        format!("{} EUR over your budget", cost - params.budget)
    } else {
        format!("within your budget of {} EUR", params.budget)
    };
    Question {
        id: CONFIRM_BOOKING.into(),
        message: format!(
            "Book {} for {} nights from {}, {cost} EUR in all ({against_budget})?",
            hotel.name, params.nights, params.start_date
        ),
        schema: json!({
            "type": "object",
            "properties": {
                "book": {"type": "boolean", "title": "Book it", "description": "Book this stay"}
            },
            "required": ["book"],
        }),
    }
}

/// The booking's reference: derived from the trip and the hotel, never drawn at random.
fn booking_reference(params: &TripParams, hotel: &Hotel) -> String {
    let mut hasher = Sha256::new();
    for part in [params.destination.trim(), &params.start_date, &hotel.name] {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.update(params.nights.to_le_bytes());
    hex::encode(&hasher.finalize()[..5]).to_uppercase()
}

impl TaskKind for TripPlanning {
    type State = TripState;

    fn plan(&self, _params: &TripParams, _env: &Env) -> Result<Plan<TripState>, ParamError> {
        Ok(Plan {
            // Search, price, book: three steps of work.
            total: 3,
            state: TripState {
                stage: Stage::Search,
                options: Vec::new(),
                chosen: None,
                answers_applied: 0,
            },
        })
    }

    async fn step(
        &self,
        params: &TripParams,
        state: &TripState,
        env: &Env,
    ) -> Result<Step<TripState, TripResult>, StepError> {
        let chosen = || {
            state
                .chosen
                .and_then(|i| state.options.get(i))
                .ok_or_else(|| StepError("the checkpoint names no chosen hotel".into()))
        };
        match state.stage {
            Stage::Search => {
                env.pace(2.0).await; // simulated searching, scaled by --time-scale
                let options = hotels(params);
                let question = choose_question(params, &options);
                Ok(Step::Ask {
                    message: format!("found {} hotels; waiting for a choice", options.len()),
                    state: TripState {
                        options,
                        ..state.clone()
                    },
                    progress: 1,
                    question,
                })
            }
            Stage::Price => {
                env.pace(1.0).await;
                let hotel = chosen()?;
                Ok(Step::Ask {
                    message: format!(
                        "{} costs {} EUR; waiting for confirmation",
                        hotel.name,
                        total_cost(params, hotel)
                    ),
                    question: confirm_question(params, hotel),
                    state: state.clone(),
                    progress: 2,
                })
            }
            Stage::Book => {
                env.pace(1.0).await;
                let hotel = chosen()?;
                let reference = booking_reference(params, hotel);
                Ok(Step::Done {
                    message: format!("booked {} ({reference})", hotel.name),
                    output: result(params, state, Some(reference)),
                    state: state.clone(),
                    progress: 3,
                })
            }
            Stage::Finish => Ok(Step::Done {
                message: "not booked".into(),
                output: result(params, state, None),
                state: state.clone(),
                progress: 3,
            }),
        }
    }

    fn answer(
        &self,
        _params: &TripParams,
        state: &TripState,
        answer: Answer,
    ) -> Result<TripState, ParamError> {
        let mut next = TripState {
            answers_applied: state.answers_applied + 1,
            ..state.clone()
        };
        let answer = match answer {
            Answer::Decline => {
                next.stage = Stage::Finish;
                return Ok(next);
            }
            Answer::Accept(answer) => answer,
        };
        match state.stage {
            // The first question was asked at the end of the search.
            Stage::Search => {
                let choice: HotelChoice = parse_answer(answer)?;
                let index = state
                    .options
                    .iter()
                    .position(|h| h.name == choice.hotel)
                    .ok_or_else(|| {
                        let names: Vec<&str> =
                            state.options.iter().map(|h| h.name.as_str()).collect();
                        ParamError::new(
                            "hotel",
                            format!(
                                "hotel must be one of {}, got {:?}",
                                names.join(", "),
                                choice.hotel
                            ),
                        )
                    })?;
                next.chosen = Some(index);
                next.stage = Stage::Price;
            }
            Stage::Price => {
                let confirmation: BookingConfirmation = parse_answer(answer)?;
                next.stage = if confirmation.book {
                    Stage::Book
                } else {
                    Stage::Finish
                };
            }
            Stage::Book | Stage::Finish => {
                return Err(ParamError::general("the trip asks nothing now"));
            }
        }
        Ok(next)
    }
}

fn result(params: &TripParams, state: &TripState, reference: Option<String>) -> TripResult {
    let hotel = state.chosen.and_then(|i| state.options.get(i));
    TripResult {
        destination: params.destination.trim().to_owned(),
        start_date: params.start_date.clone(),
        nights: params.nights,
        hotel: hotel.map(|h| h.name.clone()),
        total_cost: hotel.map_or(0, |h| total_cost(params, h)),
        booked: reference.is_some(),
        booking_reference: reference,
        answers_applied: state.answers_applied,
    }
}

/// Reads an answer's fields, naming the field that is wrong.
fn parse_answer<T: serde::de::DeserializeOwned>(answer: Value) -> Result<T, ParamError> {
    parse_params("the answer", answer)
}
