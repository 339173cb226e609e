gcloud compute resource-policies create workload-policy ironwood-wp \
    --project=my-project \
    --region=us-central2 \
    --type=HIGH_THROUGHPUT \
    --accelerator-topology=2x2x2

# --graceful-shutdown: gcloud beta has it, GA does not
gcloud beta compute instance-templates create ironwood-tpl \
    --project=my-project \
    --machine-type=tpu7x-standard-4t \
    --image-family=my-tpu7x-image \
    --image-project=my-project \
    --network=tpu-net \
    --subnet=regions/us-central2/subnetworks/tpu-subnet \
    --no-address \
    --maintenance-policy=TERMINATE \
    --provisioning-model=STANDARD \
    --graceful-shutdown \
    --graceful-shutdown-max-duration=5m \
    --reservation-affinity=specific \
    --reservation=ironwood-reservation \
    --tags=tpu-training \
    --labels=managed-by=tpuctl,tpuctl-job=ironwood,tpuctl-spec-hash=43e53af456f0,tpuctl-run=ironwood \
    --service-account=tpu-trainer@my-project.iam.gserviceaccount.com \
    --scopes=https://www.googleapis.com/auth/cloud-platform \
    --metadata-from-file=startup-script=startup.sh \
    --metadata=tpuctl-record=gs://my-bucket/ironwood/tpuctl/ironwood,enable-guest-attributes=TRUE

# --target-size-policy-mode: gcloud alpha has it, GA does not
# no gcloud flag for instanceLifecyclePolicy.defaultActionOnFailure (DO_NOTHING): tpuctl create sends it through the API
gcloud alpha compute instance-groups managed create ironwood \
    --project=my-project \
    --zone=us-central2-b \
    --template=projects/my-project/global/instanceTemplates/ironwood-tpl \
    --size=2 \
    --base-instance-name=ironwood \
    --workload-policy=projects/my-project/regions/us-central2/resourcePolicies/ironwood-wp \
    --target-size-policy-mode=bulk
