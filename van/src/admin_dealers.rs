//! On the scheduler: the connections to admin clients (`pslite status`,
//! `pslite store`), which are not cluster members. One DEALER per client
//! keeps its answers and store events in order, and a client's ROUTER takes
//! only one connection at a time with the scheduler's identity; the most
//! recently used [`ADMIN_DEALERS`] stay open. A client that is gone never
//! blocks the scheduler: its messages are dropped once its queue is full.

use pslite_proto::ids::SCHEDULER;
use pslite_proto::{Message, Node};

use crate::config::VanConfig;
use crate::links::{open_dealer, zmq_err};
use crate::transport::{self, Transport};
use crate::VanError;

/// Connections to admin clients the scheduler keeps open.
pub const ADMIN_DEALERS: usize = 32;

/// The DEALERs to admin clients, by endpoint, most recently used last.
#[derive(Default)]
pub(crate) struct AdminDealers {
    dealers: Vec<(String, zmq::Socket)>,
}

impl AdminDealers {
    /// Sends `msg` to the admin client listening at `to` (over TCP, whatever
    /// the cluster uses), on the DEALER kept for it.
    pub(crate) fn answer(
        &mut self,
        ctx: &zmq::Context,
        config: &VanConfig,
        to: &Node,
        msg: &Message,
    ) -> Result<(), VanError> {
        let endpoint = Transport::Tcp.connect_endpoint(&to.hostname, to.port);
        let socket = match self.dealers.iter().position(|(e, _)| *e == endpoint) {
            Some(i) => self.dealers.remove(i).1,
            None => {
                let socket = open_dealer(ctx, config, SCHEDULER, &endpoint)?;
                socket
                    .set_sndtimeo(0)
                    .map_err(zmq_err("setting the send timeout"))?;
                socket
            }
        };
        if self.dealers.len() >= ADMIN_DEALERS {
            // The least recently used one lingers and closes.
            self.dealers.remove(0);
        }
        self.dealers.push((endpoint.clone(), socket));
        let Some((_, socket)) = self.dealers.last_mut() else {
            return Ok(());
        };
        transport::send_message(socket, &msg.meta.encode(), &msg.data)
            .map_err(zmq_err(format!("sending to {endpoint}")))?;
        Ok(())
    }

    /// Closes every connection.
    pub(crate) fn clear(&mut self) {
        self.dealers.clear();
    }
}
