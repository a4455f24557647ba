"""tidemq's broker: gRPC service, group-commit writer, pull/ack dispatch, storage, maintenance."""
