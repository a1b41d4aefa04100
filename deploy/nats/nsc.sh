#!/usr/bin/env bash
# The matbus account and its users for a NATS server in operator (JWT) mode,
# with nsc: the same account, users and permissions as accounts.conf
# (deploytest checks that the lists below equal the file's, and faulttest
# runs the pipeline with JWTs carrying them).
#
#   OPERATOR=my-operator deploy/nats/nsc.sh          # needs nsc and an operator (nsc add operator)
#   nsc generate creds --account MATBUS --name worker > worker.creds
#   matbus worker --nats-creds worker.creds ...      # chart: nats.worker.credentials
#
# Push the account to the server's resolver as usual (nsc push, or
# nsc generate config --nats-resolver for a memory or full resolver).
# The subject prefix is the default, "mat"; for another one run the sed of
# accounts.conf on this file first.
set -euo pipefail

ACCOUNT=${ACCOUNT:-MATBUS}
if [ -n "${OPERATOR:-}" ]; then
  nsc env --operator "$OPERATOR"
fi

discovery_pub=(
  'mat.instances.>'
  'mat.jobs.sync.>'
  'mat.jobs.cleanup.>'
  'mat.errors.>'
  '$KV.MAT_STATE.leader.>'
  '$KV.MAT_STATE.instance.>'
  '$JS.API.INFO'
  '$JS.API.STREAM.NAMES'
  '$JS.API.STREAM.INFO.MAT_INSTANCES'
  '$JS.API.STREAM.INFO.MAT_SYNC'
  '$JS.API.STREAM.INFO.MAT_DELETE'
  '$JS.API.STREAM.INFO.MAT_ERRORS'
  '$JS.API.STREAM.INFO.KV_MAT_STATE'
  '$JS.API.STREAM.CREATE.MAT_INSTANCES'
  '$JS.API.STREAM.CREATE.MAT_SYNC'
  '$JS.API.STREAM.CREATE.MAT_DELETE'
  '$JS.API.STREAM.CREATE.MAT_ERRORS'
  '$JS.API.STREAM.CREATE.KV_MAT_STATE'
  '$JS.API.STREAM.UPDATE.MAT_INSTANCES'
  '$JS.API.STREAM.UPDATE.MAT_SYNC'
  '$JS.API.STREAM.UPDATE.MAT_DELETE'
  '$JS.API.STREAM.UPDATE.MAT_ERRORS'
  '$JS.API.STREAM.UPDATE.KV_MAT_STATE'
  '$JS.API.STREAM.MSG.GET.MAT_INSTANCES'
  '$JS.API.STREAM.PURGE.MAT_INSTANCES'
  # the state bucket: its entries read back at start (a watch)
  '$JS.API.DIRECT.GET.KV_MAT_STATE.>'
  '$JS.API.CONSUMER.CREATE.KV_MAT_STATE'
  '$JS.API.CONSUMER.CREATE.KV_MAT_STATE.>'
  '$JS.API.CONSUMER.INFO.KV_MAT_STATE.*'
  '$JS.API.CONSUMER.DELETE.KV_MAT_STATE.*'
  '$JS.FC.KV_MAT_STATE.>'
)

discovery_sub=(
  'mat.results.>'
  '_INBOX.>'
)

worker_pub=(
  'mat.jobs.delete.>'
  'mat.jobs.cleanup.>'
  'mat.results.>'
  'mat.errors.>'
  '$KV.MAT_STATE.hold.>'
  '$KV.MAT_STATE.worker.>'
  '$JS.API.INFO'
  '$JS.API.STREAM.INFO.MAT_INSTANCES'
  '$JS.API.STREAM.INFO.MAT_SYNC'
  '$JS.API.STREAM.INFO.MAT_DELETE'
  '$JS.API.STREAM.INFO.MAT_ERRORS'
  '$JS.API.STREAM.INFO.KV_MAT_STATE'
  '$JS.API.STREAM.CREATE.MAT_INSTANCES'
  '$JS.API.STREAM.CREATE.MAT_SYNC'
  '$JS.API.STREAM.CREATE.MAT_DELETE'
  '$JS.API.STREAM.CREATE.MAT_ERRORS'
  '$JS.API.STREAM.CREATE.KV_MAT_STATE'
  '$JS.API.STREAM.UPDATE.KV_MAT_STATE'
  '$JS.API.STREAM.MSG.GET.MAT_INSTANCES'
  # the job consumers (matbus-sync-<namespace>, matbus-delete-<namespace>)
  '$JS.API.CONSUMER.CREATE.MAT_SYNC.>'
  '$JS.API.CONSUMER.CREATE.MAT_DELETE.>'
  '$JS.API.CONSUMER.INFO.MAT_SYNC.*'
  '$JS.API.CONSUMER.INFO.MAT_DELETE.*'
  '$JS.API.CONSUMER.MSG.NEXT.MAT_SYNC.*'
  '$JS.API.CONSUMER.MSG.NEXT.MAT_DELETE.*'
  '$JS.ACK.MAT_SYNC.>'
  '$JS.ACK.MAT_DELETE.>'
  # the unfiltered job consumers of releases before namespaces,
  # removed once
  '$JS.API.CONSUMER.DELETE.MAT_SYNC.matbus-sync'
  '$JS.API.CONSUMER.DELETE.MAT_DELETE.matbus-delete'
  # the instance events (an ordered consumer)
  '$JS.API.CONSUMER.CREATE.MAT_INSTANCES.>'
  '$JS.API.CONSUMER.INFO.MAT_INSTANCES.*'
  '$JS.API.CONSUMER.DELETE.MAT_INSTANCES.*'
  '$JS.API.CONSUMER.MSG.NEXT.MAT_INSTANCES.*'
  # the state bucket's hold entries: read, watched
  '$JS.API.DIRECT.GET.KV_MAT_STATE.>'
  '$JS.API.STREAM.MSG.GET.KV_MAT_STATE'
  '$JS.API.CONSUMER.CREATE.KV_MAT_STATE'
  '$JS.API.CONSUMER.CREATE.KV_MAT_STATE.>'
  '$JS.API.CONSUMER.INFO.KV_MAT_STATE.*'
  '$JS.API.CONSUMER.DELETE.KV_MAT_STATE.*'
  '$JS.FC.KV_MAT_STATE.>'
)

worker_sub=(
  '_INBOX.>'
)

reader_pub=(
  '$JS.API.INFO'
  '$JS.API.STREAM.INFO.MAT_INSTANCES'
  '$JS.API.STREAM.INFO.MAT_SYNC'
  '$JS.API.STREAM.INFO.MAT_DELETE'
  '$JS.API.STREAM.INFO.MAT_ERRORS'
  '$JS.API.STREAM.INFO.KV_MAT_STATE'
  '$JS.API.STREAM.MSG.GET.MAT_INSTANCES'
  '$JS.API.CONSUMER.INFO.MAT_SYNC.*'
  '$JS.API.CONSUMER.INFO.MAT_DELETE.*'
  # the error stream (an ordered consumer)
  '$JS.API.CONSUMER.CREATE.MAT_ERRORS.>'
  '$JS.API.CONSUMER.INFO.MAT_ERRORS.*'
  '$JS.API.CONSUMER.DELETE.MAT_ERRORS.*'
  '$JS.API.CONSUMER.MSG.NEXT.MAT_ERRORS.*'
  # the state bucket
  '$JS.API.DIRECT.GET.KV_MAT_STATE.>'
  '$JS.API.STREAM.MSG.GET.KV_MAT_STATE'
  '$JS.API.CONSUMER.CREATE.KV_MAT_STATE'
  '$JS.API.CONSUMER.CREATE.KV_MAT_STATE.>'
  '$JS.API.CONSUMER.INFO.KV_MAT_STATE.*'
  '$JS.API.CONSUMER.DELETE.KV_MAT_STATE.*'
  '$JS.FC.KV_MAT_STATE.>'
)

reader_sub=(
  'mat.errors.>'
  '_INBOX.>'
)

nsc add account --name "$ACCOUNT"
# JetStream for the account, without limits of its own (set them to taste).
nsc edit account --name "$ACCOUNT" --js-mem-storage -1 --js-disk-storage -1 --js-streams -1 --js-consumer -1

for user in discovery worker reader; do
  pub="${user}_pub[@]"
  sub="${user}_sub[@]"
  args=()
  for s in "${!pub}"; do args+=(--allow-pub "$s"); done
  for s in "${!sub}"; do args+=(--allow-sub "$s"); done
  nsc add user --account "$ACCOUNT" --name "$user" "${args[@]}"
done
