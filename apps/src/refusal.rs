//! Refusing a request this node cannot take: the requester is answered at
//! once with why ([`Refusal`], `PBMeta` field 120), so its wait fails with
//! [`Failure::Refused`](crate::Failure::Refused) in about one round trip
//! instead of waiting forever. Only a pslite requester is told (a C++ node
//! would not know the field): for a C++ requester the refusal is logged.

use log::warn;
use pslite_postoffice::Postoffice;
use pslite_proto::refusal::{self, Refusal};
use pslite_proto::Meta;

/// Answers request `request` (its meta as received) with `refusal`.
pub(crate) fn refuse(po: &Postoffice, request: &Meta, refusal: Refusal) {
    let requester = request.sender;
    if !po.is_pslite(requester) {
        warn!(
            "dropping a request from node {requester}, which is not a pslite node and cannot \
             be told why: {refusal}"
        );
        return;
    }
    warn!("refusing a request from node {requester}: {refusal}");
    if let Err(e) = po.send(refusal::response(request, refusal)) {
        warn!("cannot tell node {requester} that its request was refused: {e}");
    }
}
