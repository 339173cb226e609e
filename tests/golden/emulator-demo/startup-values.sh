SPEC_NAME='emulator-demo'
RUN_NAME='emulator-demo'
JOB_USER='tpuctl'
WORKDIR_SPEC='~/job'
CODE='../scripts/toy_train.py'
CHECKPOINT_DIR_SPEC='/tmp/tpuctl-demo/ckpt'
CHECKPOINT_ROOT_SPEC='/tmp/tpuctl-demo/ckpt'
DONE_MARKER_SPEC='/tmp/tpuctl-demo/ckpt/tpuctl/emulator-demo/DONE'
ZONE_CLAIM_SPEC=''
WORKER_STATES_SPEC='/tmp/tpuctl-demo/ckpt/tpuctl/emulator-demo/workers'
FRAMEWORK='orbax'
JOB_COMMAND='python3 toy_train.py --steps 300 --step-seconds 0.2 --checkpoint-every 25'
MULTISLICE=1
AUTOCHECKPOINT=1
TARGET_STEP=300
SETUP_COMMANDS=()
JOB_ENV=()
STATE_ROOT='/var/lib/tpuctl'
LOG_ROOT='/var/log/tpuctl'
CODE_READY_MARKER='.tpuctl-uploaded'
BOOT_SCRIPT=''
GRACE_SECONDS=300
NOFILE_LIMIT=1048576

# The framework preset's flags, filled in once the checkpoint dir is resolved.
preset_args() {
  PRESET_ARGS=()
}
