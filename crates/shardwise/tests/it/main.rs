//! Process-level tests: real `shardwise` processes on 127.0.0.1 with ephemeral ports, each
//! bounded in time and cleaned up (children are killed when their handle drops).

mod support;

mod check_table;
mod clients;
mod demo;
mod init_cluster;
mod init_validation;
mod launcher;
mod liveness;
mod load;
mod local;
mod queries;
mod repair_table;
mod replace_node;
mod sql_client;
mod tables;
