SPEC_NAME='maxtext-v4-ms'
RUN_NAME='llama2-7b-v4-ms'
JOB_USER='tpuctl'
WORKDIR_SPEC='~/maxtext'
CODE=''
CHECKPOINT_DIR_SPEC='gs://my-bucket/maxtext'
CHECKPOINT_ROOT_SPEC='gs://my-bucket/maxtext/llama2-7b-v4-ms/checkpoints'
DONE_MARKER_SPEC='gs://my-bucket/maxtext/tpuctl/llama2-7b-v4-ms/DONE'
ZONE_CLAIM_SPEC=''
WORKER_STATES_SPEC='gs://my-bucket/maxtext/tpuctl/llama2-7b-v4-ms/workers'
FRAMEWORK='maxtext'
JOB_COMMAND='python3 MaxText/train.py MaxText/configs/base.yml model_name=llama2-7b per_device_batch_size=4 steps=20000 dataset_type=synthetic ici_fsdp_parallelism=64 dcn_data_parallelism=2 checkpoint_period=500'
MULTISLICE=1
AUTOCHECKPOINT=1
TARGET_STEP=19999
SETUP_COMMANDS=(
  'test -d .git || git clone --depth 1 https://github.com/AI-Hypercomputer/maxtext.git .'
  'python3 -m pip install --user -q -r requirements.txt'
)
JOB_ENV=(
  'TF_CPP_MIN_LOG_LEVEL=2'
)
STATE_ROOT='/var/lib/tpuctl'
LOG_ROOT='/var/log/tpuctl'
CODE_READY_MARKER='.tpuctl-uploaded'
BOOT_SCRIPT=''
GRACE_SECONDS=300
NOFILE_LIMIT=1048576

# The framework preset's flags, filled in once the checkpoint dir is resolved.
preset_args() {
  PRESET_ARGS=(
    'run_name='"$RUN_NAME"
    'base_output_directory='"$CHECKPOINT_DIR"
    'enable_checkpointing=true'
    'async_checkpointing=true'
    'enable_autocheckpoint=true'
  )
}
