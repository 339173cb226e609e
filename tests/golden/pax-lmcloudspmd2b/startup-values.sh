SPEC_NAME='pax-2b'
RUN_NAME='pax-2b'
JOB_USER='tpuctl'
WORKDIR_SPEC='~'
CODE=''
CHECKPOINT_DIR_SPEC='gs://my-bucket/pax/lmcloudspmd2b'
CHECKPOINT_ROOT_SPEC='gs://my-bucket/pax/lmcloudspmd2b/checkpoints'
DONE_MARKER_SPEC='gs://my-bucket/pax/lmcloudspmd2b/tpuctl/pax-2b/DONE'
ZONE_CLAIM_SPEC=''
WORKER_STATES_SPEC='gs://my-bucket/pax/lmcloudspmd2b/tpuctl/pax-2b/workers'
FRAMEWORK='pax'
JOB_COMMAND='python3 .local/lib/python3.10/site-packages/paxml/main.py --exp=tasks.lm.params.lm_cloud.LmCloudSpmd2B'
MULTISLICE=0
AUTOCHECKPOINT=1
TARGET_STEP=
SETUP_COMMANDS=(
  'python3 -m pip install --user -q paxml jax[tpu] -f https://storage.googleapis.com/jax-releases/libtpu_releases.html'
)
JOB_ENV=()
STATE_ROOT='/var/lib/tpuctl'
LOG_ROOT='/var/log/tpuctl'
CODE_READY_MARKER='.tpuctl-uploaded'
BOOT_SCRIPT=''
GRACE_SECONDS=300
NOFILE_LIMIT=1048576

# The framework preset's flags, filled in once the checkpoint dir is resolved.
preset_args() {
  PRESET_ARGS=(
    '--job_log_dir='"$CHECKPOINT_DIR"
    '--jax_fully_async_checkpoint=1'
    '--exit_after_ondemand_checkpoint=1'
  )
}
