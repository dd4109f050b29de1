//! The part of `GET /health/detailed` that is vocabulary: the lifecycle state and the
//! drain. The server writes [`Drain`] into its (larger) body; a producer reads the two
//! fields it needs as a [`LifecycleView`] and ignores the rest.

use serde::{Deserialize, Serialize};

use crate::state::GatewayState;

/// A drain in progress (`null` otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Drain {
    /// Seconds left in the drain window, to a tenth; the drain may end sooner.
    pub remaining_s: f64,
    /// Sends admitted before the drain and not yet finished.
    #[serde(default)]
    pub in_flight: usize,
    /// Seconds left, to a tenth, before which the drain does not end even with nothing in
    /// flight (`SENDGATE_DRAIN_LINGER_S`: time for load balancers to stop routing here);
    /// 0 once it has passed, or from a gateway that does not linger.
    #[serde(default)]
    pub linger_remaining_s: f64,
}

/// What a producer reads of `/health/detailed`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct LifecycleView {
    /// Kept as sent: a newer gateway may announce a state this version does not know.
    pub gateway_state: String,
    #[serde(default)]
    pub drain: Option<Drain>,
}

impl LifecycleView {
    /// The state, forgivingly parsed; `None` for one this version does not know.
    pub fn state(&self) -> Option<GatewayState> {
        GatewayState::parse(&self.gateway_state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_producer_reads_the_state_and_the_drain_and_ignores_the_rest() {
        let v: LifecycleView = serde_json::from_str(
            r#"{"status":"degraded","gateway_state":"draining","version":"1","pid":7,
                "drain":{"remaining_s":12.5,"in_flight":3,"linger_remaining_s":1.5},"queues":{},"backends":{}}"#,
        )
        .unwrap();
        assert_eq!(v.state(), Some(GatewayState::Draining));
        assert_eq!(
            v.drain,
            Some(Drain {
                remaining_s: 12.5,
                in_flight: 3,
                linger_remaining_s: 1.5
            })
        );
        let v: LifecycleView =
            serde_json::from_str(r#"{"gateway_state":"running","drain":null}"#).unwrap();
        assert_eq!((v.state(), v.drain), (Some(GatewayState::Running), None));
        let v: LifecycleView = serde_json::from_str(r#"{"gateway_state":"sideways"}"#).unwrap();
        assert_eq!(v.state(), None);
    }

    #[test]
    fn the_drain_serializes_as_the_server_wrote_it() {
        let d = Drain {
            remaining_s: 4.2,
            in_flight: 1,
            linger_remaining_s: 0.5,
        };
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"remaining_s":4.2,"in_flight":1,"linger_remaining_s":0.5}"#
        );
        // A gateway from before the linger is read as one without it.
        let old: Drain = serde_json::from_str(r#"{"remaining_s":4.2,"in_flight":1}"#).unwrap();
        assert_eq!(old.linger_remaining_s, 0.0);
    }
}
