// sendgate on Azure: Service Bus (namespace + request queue), a user-assigned managed
// identity with only the data-plane roles it needs, Log Analytics, a Container Apps
// environment, the sendgate Container App, when it may run more than one replica an Azure
// Managed Redis the replicas share the ceiling through, and (deployAlerts) alert rules on
// the gateway's events and 5xx answers. See infra/README.md for the deploy commands.
//
//   az deployment group create -g <rg> -f infra/main.bicep -p @infra/main.parameters.json
//
// Every environment variable set on the container is one sendgate reads (src/config/vars.rs
// VARIABLES), plus AZURE_CLIENT_ID (read by azure_identity); scripts/lint-infra.sh checks it.

targetScope = 'resourceGroup'

// ---------------------------------------------------------------------------------------
// Parameters
// ---------------------------------------------------------------------------------------

@description('Azure region for every resource.')
param location string = resourceGroup().location

@description('Lower-case prefix of resource names (letters, digits, hyphens; starts with a letter).')
@minLength(2)
@maxLength(20)
param namePrefix string = 'sendgate'

@description('Container image to run, e.g. myregistry.azurecr.io/sendgate:0.1.0 (built from the repository Dockerfile).')
param image string

@description('Optional: name of an Azure Container Registry in THIS resource group holding the image. When set, the identity gets AcrPull on that registry only and pulls with it. Leave empty for a public image.')
param containerRegistryName string = ''

// --- Service Bus ---

@description('Queues sendgate serves (SENDGATE_QUEUES). Each is created here with duplicate detection on. Names: letters, digits, ".", "-", "_", starting with a letter or digit.')
@minLength(1)
param queueNames array = [
  'requests'
]

@description('Disable SAS (shared access key) authentication on the namespace: only Entra ID (the managed identity) can send. Keep true unless some other client must use SAS keys.')
param disableLocalAuth bool = true

@description('Duplicate-detection window (ISO 8601). sendgate sets MessageId = Idempotency-Key, so a retried send inside this window is stored once. Note: duplicate detection itself cannot be turned on or off after a queue is created.')
param duplicateDetectionWindow string = 'PT10M'

@description('Deliveries of one message before it is dead-lettered.')
@minValue(1)
@maxValue(2000)
param maxDeliveryCount int = 10

@description('Peek-lock duration of the queue for the workers (ISO 8601, at most PT5M).')
param lockDuration string = 'PT1M'

@description('Time to live of a message on the queue (ISO 8601); expired messages are dead-lettered.')
param messageTimeToLive string = 'P14D'

@description('Queue size in MB (Standard tier: 1024, 2048, 3072, 4096 or 5120).')
@allowed([
  1024
  2048
  3072
  4096
  5120
])
param maxQueueSizeInMegabytes int = 1024

@description('Read the backlog so sendgate can enforce the ceiling: the identity gets "Reader" on each queue and sendgate reads the counts from Azure Resource Manager (SENDGATE_SERVICEBUS_DEPTH_SOURCE=arm), with no data-plane right beyond Data Sender. false: sends only; the ceiling is never enforced and SERVICEBUS_SEND_FAILCLOSED must stay off. Turning it off later leaves the Reader assignments in place (ARM incremental mode; infra/README.md).')
param readDepth bool = true

// --- sendgate settings ---

@description('SERVICEBUS_SEND_MAX_QUEUE_DEPTH: backlog ceiling per queue; at or over it sends get 429 queue_full.')
@minValue(1)
param maxQueueDepth int = 2000

@description('SERVICEBUS_SEND_FAILCLOSED: refuse sends (503 capacity_unknown) after failClosedStreak failed depth reads. Keep false unless readDepth is true AND /health/detailed shows a backlog for every queue; the deployment fails if this is true while readDepth is false.')
param failClosed bool = false

@description('SERVICEBUS_SEND_FAILCLOSED_STREAK: consecutive failed depth reads before failing closed.')
@minValue(1)
param failClosedStreak int = 3

@description('SENDGATE_DEPTH_TTL_MS: reuse a depth read this long. With readDepth the read is Azure Resource Manager\'s (one per TTL for the whole fleet, within ARM\'s read throttling); at least 1000.')
@minValue(1000)
param depthTtlMs int = 1000

@description('SENDGATE_DRAIN_TIMEOUT_S: longest drain after SIGTERM (sends in flight finish, new sends get 503 draining).')
@minValue(1)
@maxValue(570)
param drainTimeoutSeconds int = 30

@description('SENDGATE_DRAIN_LINGER_S: shortest drain. After SIGTERM the replica keeps answering 503 draining (readiness 503) at least this long, even with nothing in flight, while the ingress stops routing to it; then it exits. Cut to drainTimeoutSeconds (the window ends every drain).')
@minValue(0)
@maxValue(570)
param drainLingerSeconds int = 5

@description('Seconds the platform waits after the drain window before killing the replica: terminationGracePeriodSeconds = drainTimeoutSeconds + this (at most 600 in total).')
@minValue(5)
@maxValue(30)
param terminationGraceMarginSeconds int = 15

// --- API keys (Key Vault) ---

@description('Name of an EXISTING Key Vault holding the API keys file (RBAC permission model).')
param keyVaultName string

@description('Resource group of that Key Vault (defaults to this one).')
param keyVaultResourceGroupName string = resourceGroup().name

@description('Name of the Key Vault secret whose value is the API keys TOML file (made with `sendgate keys new`; it holds only SHA-256 digests of the tokens).')
param apiKeysSecretName string = 'sendgate-api-keys'

@description('Grant the identity "Key Vault Secrets User" on that one secret. Needs permission to create role assignments on the vault; set false when the vault owner grants it instead (see infra/README.md).')
param grantKeyVaultAccess bool = true

// --- Container App ---

@description('true: ingress reachable from the internet (HTTPS only). false: without infrastructureSubnetId, reachable only inside the Container Apps environment; with it, the environment is internal (an internal load balancer in that virtual network) and the app is reachable from the virtual network (and networks peered with it), not from the internet. Fixed once the environment exists in a virtual network.')
param externalIngress bool = true

@description('Optional: subnet (resource id, delegated to Microsoft.App/environments, /23 or larger for a Consumption-only environment) for the Container Apps environment. With externalIngress=false the environment gets an internal load balancer in that virtual network.')
param infrastructureSubnetId string = ''

@description('Optional ingress IP allow-list: [{ name, ipAddressRange: "203.0.113.0/24", action: "Allow" }]. Empty = no restriction.')
param ipSecurityRestrictions array = []

@description('Minimum replicas. Keep at least 1: a gateway scaled to zero answers its first request late.')
@minValue(0)
@maxValue(300)
param minReplicas int = 1

@description('Maximum replicas. Above 1 the replicas share one ceiling through Azure Managed Redis; see docs/operations.md (Running a fleet).')
@minValue(1)
@maxValue(300)
param maxReplicas int = 5

@description('HTTP scale rule: concurrent requests per replica before another replica is added.')
@minValue(1)
param httpConcurrentRequests int = 100

@description('vCPU per replica (Consumption: 0.25 to 2 in steps of 0.25), as a string.')
param cpu string = '0.5'

@description('Memory per replica; must pair with cpu (0.5 vCPU -> 1Gi).')
param memory string = '1Gi'

// --- Redis (shared ceiling; only when maxReplicas > 1) ---

@description('Azure Managed Redis SKU (deployed only when maxReplicas > 1). sendgate keeps a few small keys per queue there: the smallest sizes are plenty. Only Azure Managed Redis SKUs (hosts *.redis.azure.net, port 10000), not the older Enterprise ones.')
@allowed([
  'Balanced_B0'
  'Balanced_B1'
  'Balanced_B3'
  'Balanced_B5'
  'Balanced_B10'
  'MemoryOptimized_M10'
  'ComputeOptimized_X3'
  'ComputeOptimized_X5'
  'ComputeOptimized_X10'
])
param redisSku string = 'Balanced_B1'

@description('Replicate the Redis data set (a replica shard on another node). Without it a node failure loses the shared counts; sendgate then falls back to per-replica ceilings until Redis answers again, and re-reads the depth.')
param redisHighAvailability bool = true

@description('Clustering policy of the Redis database. NoCluster: one shard, every command (also multi-key scripts) works with a plain, non-cluster client, as sendgate uses; offered for the smaller sizes. EnterpriseCluster: for larger sizes; the proxy routes single-key commands, but keys of one multi-key call must share a hash slot. Cannot be changed once created (except from NoCluster).')
@allowed([
  'NoCluster'
  'EnterpriseCluster'
])
param redisClusteringPolicy string = 'NoCluster'

@description('Optional: subnet (resource id) for the Redis private endpoint, in the virtual network of infrastructureSubnetId (or one peered with it), NOT the environment\'s delegated subnet. Set: Redis gets publicNetworkAccess Disabled and is reachable only through that endpoint. Empty: Redis keeps its public endpoint, guarded by Entra ID (access keys off) and TLS only. Needs infrastructureSubnetId; the deployment fails otherwise.')
param redisPrivateEndpointSubnetId string = ''

@description('Optional, with redisPrivateEndpointSubnetId: resource id of an EXISTING private DNS zone privatelink.redis.azure.net (e.g. a hub\'s central zone, already linked to the environment\'s virtual network). Empty: the zone is created in this resource group and linked to the private endpoint subnet\'s virtual network.')
param redisPrivateDnsZoneId string = ''

@description('SENDGATE_REDIS_TIMEOUT_MS: deadline of one Redis call; past it the replica falls back to its own ceiling until Redis answers again.')
@minValue(1)
@maxValue(10000)
param redisTimeoutMs int = 250

@description('Log Analytics retention in days.')
@minValue(30)
@maxValue(730)
param logRetentionDays int = 30

// --- Entra ID callers (infra/README.md "Entra ID callers") ---

@description('SENDGATE_ENTRA_TENANT_ID: accept Microsoft Entra ID access tokens issued by this directory (tenant id, a GUID) as callers\' credentials, beside the API keys. Empty: API keys only.')
param entraTenantId string = ''

@description('SENDGATE_ENTRA_AUDIENCE: the gateway API\'s application (client) id or app-id URI, as the tokens\' aud carries it (api://<app id> for tokens asked for with scope api://<app id>/.default). Required with entraTenantId.')
param entraAudience string = ''

@description('SENDGATE_ENTRA_ALLOWED_APPS: the calling applications (client ids: a Playground\'s managed identity, a batch job\'s) whose tokens are accepted. Empty: every app the directory gave one of the gateway\'s app roles.')
param entraAllowedApps array = []

// --- Telemetry (OpenTelemetry through the environment's managed agent) ---

@description('Application Insights (workspace-based, on the Log Analytics workspace) as the destination of the Container Apps environment\'s managed OpenTelemetry agent: the gateway\'s spans (one per send) and logs reach it over OTLP. The agent sets OTEL_EXPORTER_OTLP_ENDPOINT in the app, which turns sendgate\'s export on. false: no Application Insights, no agent, no export.')
param deployAppInsights bool = true

// --- Alerts (modules/alerts.bicep; infra/README.md "Alerts") ---

@description('Deploy the alert rules and their action group. false: none (nothing else changes).')
param deployAlerts bool = true

@description('E-mail addresses the alerts notify. Empty: no e-mail receivers (the alerts still fire and show in the portal).')
param alertEmails array = []

@description('Webhooks the alerts call, as { "<receiver name>": "https://..." } (common alert schema). Secure, since such URLs often embed a token; HTTPS only. Empty: no webhook receivers.')
@secure()
param alertWebhooks object = {}

@description('5xx answers in 5 minutes (Requests metric) at or above which the 5xx alert fires. A count, not a ratio: size it to the traffic.')
@minValue(1)
param alertServerErrorsPer5Min int = 20

@description('Tags applied to every resource.')
param tags object = {
  app: 'sendgate'
}

// ---------------------------------------------------------------------------------------
// Names and constants
// ---------------------------------------------------------------------------------------

var suffix = uniqueString(resourceGroup().id, namePrefix)
var serviceBusName = take('${namePrefix}-sb-${suffix}', 50)
var identityName = '${namePrefix}-id'
var logAnalyticsName = '${namePrefix}-logs'
var appInsightsName = '${namePrefix}-insights'
var environmentName = '${namePrefix}-env'
var appName = take(namePrefix, 32)
var redisName = take('${namePrefix}-redis-${suffix}', 60)


var containerPort = 8080
var apiKeysMountPath = '/etc/sendgate'
var apiKeysFileName = 'keys.toml'
// sendgate refuses a linger longer than its window; the window ends every drain anyway.
var drainLingerEffectiveSeconds = min(drainLingerSeconds, drainTimeoutSeconds)
// A drain (linger included: it lies inside the window) never outlasts the window, so the
// window plus the margin covers the whole of it.
var terminationGracePeriodSeconds = drainTimeoutSeconds + terminationGraceMarginSeconds

// ---------------------------------------------------------------------------------------
// Redis: shared ceiling across replicas
// ---------------------------------------------------------------------------------------

// More than one replica means more than one process admitting sends against the same
// ceiling: they share the depth read, the fail-closed streak and the admitted count through
// Redis (SENDGATE_COORDINATION=redis). One replica keeps them in memory and needs no Redis.
var useRedis = maxReplicas > 1
var redisPrivate = useRedis && !empty(redisPrivateEndpointSubnetId)
var createRedisDnsZone = redisPrivate && empty(redisPrivateDnsZoneId)
// Azure Managed Redis serves TLS on 10000 (the only port of the database it creates).
var redisPort = 10000
// The private endpoint subnet's virtual network (the DNS zone is linked to it).
var redisEndpointVnetId = empty(redisPrivateEndpointSubnetId) ? '' : substring(redisPrivateEndpointSubnetId, 0, lastIndexOf(redisPrivateEndpointSubnetId, '/subnets/'))
// Azure Managed Redis's private link zone (the older Enterprise SKUs use another one).
var redisPrivateDnsZoneName = 'privatelink.redis.azure.net'
// Access policy assignment names are letters and digits only.
var redisAccessName = take(replace('${namePrefix}gateway', '-', ''), 60)

// Guard, as for failClosed: a private endpoint the environment cannot reach (no virtual
// network of its own) would leave every replica on its own ceiling, silently.
var redisPrivateGuard = 'redisPrivateEndpointSubnetId needs infrastructureSubnetId: without a virtual network the Container Apps environment cannot reach a private endpoint'
var redisPublicNetworkAccess = redisPrivate ? (empty(infrastructureSubnetId) ? string(int(redisPrivateGuard)) : 'Disabled') : 'Enabled'

// Only used with infrastructureSubnetId: the environment joins that virtual network, with an
// internal load balancer when ingress is internal.
var vnetConfiguration = {
  infrastructureSubnetId: infrastructureSubnetId
  internal: !externalIngress
}

// Image pull with the identity (only with containerRegistryName).
var registryCredentials = [
  {
    server: '${containerRegistryName}${environment().suffixes.acrLoginServer}'
    identity: identity.id
  }
]

// Versionless secret URL: Container Apps fetches the secret's latest version.
var apiKeysSecretUri = 'https://${keyVaultName}${environment().suffixes.keyvaultDns}/secrets/${apiKeysSecretName}'

// Guard: fail-closed without the right to read the depth is an outage by configuration
// (every depth read fails, so after the streak every send answers 503). ARM evaluates only
// the branch taken, so this errors at deployment time only for that combination, with the
// message below in the error.
var failClosedGuard = 'failClosed=true needs readDepth=true: without Reader every depth read fails and every send would fail closed'
var failClosedSetting = failClosed ? (readDepth ? 'true' : string(int(failClosedGuard))) : 'false'

// Guard, as above: a tenant without an audience would accept no token at all (the gateway
// refuses to start so configured).
var entraGuard = 'entraTenantId needs entraAudience: the gateway checks every token\'s aud against it'
var useEntra = !empty(entraTenantId)
var entraEnv = useEntra ? concat([
  {
    name: 'SENDGATE_ENTRA_TENANT_ID'
    value: entraTenantId
  }
  {
    name: 'SENDGATE_ENTRA_AUDIENCE'
    value: empty(entraAudience) ? string(int(entraGuard)) : entraAudience
  }
], empty(entraAllowedApps) ? [] : [
  {
    name: 'SENDGATE_ENTRA_ALLOWED_APPS'
    value: join(entraAllowedApps, ',')
  }
]) : []

// The depth source Reader can read (see queueReader).
var depthEnv = readDepth ? [
  {
    name: 'SENDGATE_SERVICEBUS_DEPTH_SOURCE'
    value: 'arm'
  }
  {
    name: 'SENDGATE_SERVICEBUS_ARM_NAMESPACE_ID'
    value: serviceBus.id
  }
] : []

// The service name the spans carry (the agent adds the endpoint, not the name); no metrics
// export: the agent's Application Insights destination takes none (each export would fail).
var telemetryEnv = deployAppInsights ? [
  {
    name: 'OTEL_SERVICE_NAME'
    value: appName
  }
  {
    name: 'OTEL_METRICS_EXPORTER'
    value: 'none'
  }
] : []

// ---------------------------------------------------------------------------------------
// Identity
// ---------------------------------------------------------------------------------------

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: identityName
  location: location
  tags: tags
}

// ---------------------------------------------------------------------------------------
// Service Bus
// ---------------------------------------------------------------------------------------

resource serviceBus 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: serviceBusName
  location: location
  tags: tags
  sku: {
    name: 'Standard'
    tier: 'Standard'
  }
  properties: {
    minimumTlsVersion: '1.2'
    disableLocalAuth: disableLocalAuth
    // Standard has no private endpoints or IP firewall (Premium only): access is
    // guarded by Entra ID + RBAC (and SAS is off by default).
    publicNetworkAccess: 'Enabled'
  }
}

resource queues 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = [
  for queueName in queueNames: {
    parent: serviceBus
    name: queueName
    properties: {
      requiresDuplicateDetection: true
      duplicateDetectionHistoryTimeWindow: duplicateDetectionWindow
      maxDeliveryCount: maxDeliveryCount
      lockDuration: lockDuration
      defaultMessageTimeToLive: messageTimeToLive
      deadLetteringOnMessageExpiration: true
      maxSizeInMegabytes: maxQueueSizeInMegabytes
      enablePartitioning: false
      requiresSession: false
    }
  }
]

// Sends: "Azure Service Bus Data Sender", scoped to each queue (not the namespace). Each
// assignment is named from the identity's principal id (in a module: see
// modules/queue-role.bicep), so a recreated identity gets assignments of its own.
module queueSender 'modules/queue-role.bicep' = [
  for (queueName, i) in queueNames: {
    name: take('${namePrefix}-send-${i}-${uniqueString(queueName)}', 64)
    params: {
      namespaceName: serviceBus.name
      queueName: queues[i].name
      principalId: identity.properties.principalId
      right: 'send'
      purpose: 'sendgate: send messages to this queue'
    }
  }
]

// Depth reads from Azure Resource Manager's queue resource (properties.countDetails): the
// "Reader" role on each queue, no data-plane right. The namespace's own management endpoint
// would need the Manage right, which only "Azure Service Bus Data Owner" carries (purge,
// reconfigure): never granted here. Only when readDepth.
module queueReader 'modules/queue-role.bicep' = [
  for (queueName, i) in queueNames: if (readDepth) {
    name: take('${namePrefix}-read-${i}-${uniqueString(queueName)}', 64)
    params: {
      namespaceName: serviceBus.name
      queueName: queues[i].name
      principalId: identity.properties.principalId
      right: 'read'
      purpose: 'sendgate: read this queue\'s message counts (backlog ceiling)'
    }
  }
]

// ---------------------------------------------------------------------------------------
// Key Vault: read access to the one secret holding the API keys file
// ---------------------------------------------------------------------------------------

module apiKeysSecretAccess 'modules/keyvault-secret-reader.bicep' = if (grantKeyVaultAccess) {
  name: '${namePrefix}-kv-secret-reader'
  scope: resourceGroup(keyVaultResourceGroupName)
  params: {
    keyVaultName: keyVaultName
    secretName: apiKeysSecretName
    principalId: identity.properties.principalId
  }
}

// ---------------------------------------------------------------------------------------
// Redis (Azure Managed Redis), only when maxReplicas > 1: TLS only, Entra ID only
// ---------------------------------------------------------------------------------------

resource redis 'Microsoft.Cache/redisEnterprise@2025-07-01' = if (useRedis) {
  name: redisName
  location: location
  tags: tags
  sku: {
    name: redisSku
  }
  properties: {
    minimumTlsVersion: '1.2'
    highAvailability: redisHighAvailability ? 'Enabled' : 'Disabled'
    // Disabled with a private endpoint. Without one Azure Managed Redis offers no IP
    // firewall: the public endpoint is guarded by Entra ID (no keys exist) and TLS.
    publicNetworkAccess: redisPublicNetworkAccess
  }
}

resource redisDatabase 'Microsoft.Cache/redisEnterprise/databases@2025-07-01' = if (useRedis) {
  parent: redis
  // Azure Managed Redis has exactly one database, named default.
  name: 'default'
  properties: {
    // TLS only: no plaintext listener.
    clientProtocol: 'Encrypted'
    port: redisPort
    // No access keys: the only way in is an Entra token of an identity with an access
    // policy assignment below, so there is no Redis secret to store, leak or rotate.
    accessKeysAuthentication: 'Disabled'
    clusteringPolicy: redisClusteringPolicy
    // Coordination state must not be evicted to make room: under memory pressure a write
    // fails, and the replica falls back to its own ceiling instead of sharing a wrong one.
    evictionPolicy: 'NoEviction'
    // No persistence: every value is re-derived (depth re-read, counts restart) after a loss.
  }
}

// The gateway's identity (the one it uses for Service Bus) gets the built-in "default"
// data access policy; the URL's user is that identity's object id.
resource redisAccess 'Microsoft.Cache/redisEnterprise/databases/accessPolicyAssignments@2025-07-01' = if (useRedis) {
  parent: redisDatabase
  name: redisAccessName
  properties: {
    accessPolicyName: 'default'
    user: {
      objectId: identity.properties.principalId
    }
  }
}

resource redisDnsZone 'Microsoft.Network/privateDnsZones@2020-06-01' = if (createRedisDnsZone) {
  name: redisPrivateDnsZoneName
  location: 'global'
  tags: tags
}

resource redisDnsZoneLink 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2020-06-01' = if (createRedisDnsZone) {
  parent: redisDnsZone
  name: '${namePrefix}-redis-link'
  location: 'global'
  tags: tags
  properties: {
    virtualNetwork: {
      id: redisEndpointVnetId
    }
    registrationEnabled: false
  }
}

resource redisEndpoint 'Microsoft.Network/privateEndpoints@2024-05-01' = if (redisPrivate) {
  name: '${namePrefix}-redis-pe'
  location: location
  tags: tags
  properties: {
    subnet: {
      id: redisPrivateEndpointSubnetId
    }
    privateLinkServiceConnections: [
      {
        name: 'redis'
        properties: {
          privateLinkServiceId: redis.id
          groupIds: [
            'redisEnterprise'
          ]
        }
      }
    ]
  }
  dependsOn: [
    redisDatabase
  ]
}

resource redisEndpointDns 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2024-05-01' = if (redisPrivate) {
  parent: redisEndpoint
  name: 'default'
  properties: {
    privateDnsZoneConfigs: [
      {
        name: 'redis'
        properties: {
          privateDnsZoneId: createRedisDnsZone ? redisDnsZone.id : redisPrivateDnsZoneId
        }
      }
    ]
  }
  dependsOn: [
    redisDnsZoneLink
  ]
}

// What the container is told. ARM evaluates only the branch taken, so the Redis properties
// are never read when Redis is not deployed.
var coordinationEnv = useRedis ? [
  {
    name: 'SENDGATE_COORDINATION'
    value: 'redis'
  }
  {
    // Entra auth: the user is the identity's object id, and there is no password.
    name: 'SENDGATE_REDIS_URL'
    value: 'rediss://${identity.properties.principalId}@${redis!.properties.hostName}:${redisPort}'
  }
  {
    name: 'SENDGATE_REDIS_AUTH'
    value: 'entra'
  }
  {
    name: 'SENDGATE_REDIS_PREFIX'
    value: namePrefix
  }
  {
    name: 'SENDGATE_REDIS_TIMEOUT_MS'
    value: string(redisTimeoutMs)
  }
  {
    // A rollout runs the old revision's replicas beside the new one's: twice the scale
    // rule's maximum can run at once, and a replica cut off from Redis divides the room by it.
    name: 'SENDGATE_FLEET_MAX_REPLICAS'
    value: string(maxReplicas * 2)
  }
] : [
  {
    name: 'SENDGATE_COORDINATION'
    value: 'local'
  }
]

// ---------------------------------------------------------------------------------------
// Container registry (optional): pull the image with the identity
// ---------------------------------------------------------------------------------------

module registryPull 'modules/registry-pull.bicep' = if (!empty(containerRegistryName)) {
  name: '${namePrefix}-acr-pull'
  params: {
    registryName: containerRegistryName
    principalId: identity.properties.principalId
  }
}

// ---------------------------------------------------------------------------------------
// Logs and the Container Apps environment
// ---------------------------------------------------------------------------------------

resource logAnalytics 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: logAnalyticsName
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: logRetentionDays
  }
}

// Workspace-based: its data lives in the Log Analytics workspace above (same retention,
// same access control). Local auth stays on: the managed agent sends with the connection
// string, which has no Entra ID option.
resource appInsights 'Microsoft.Insights/components@2020-02-02' = if (deployAppInsights) {
  name: appInsightsName
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: logAnalytics.id
    IngestionMode: 'LogAnalytics'
    publicNetworkAccessForIngestion: 'Enabled'
    publicNetworkAccessForQuery: 'Enabled'
  }
}

// The managed OpenTelemetry agent (an API version that has it: preview only so far) sends
// what the app exports over OTLP to Application Insights: traces and logs (the agent's
// Application Insights destination takes no metrics; the Prometheus page stays for those).
resource containerEnvironment 'Microsoft.App/managedEnvironments@2024-10-02-preview' = {
  name: environmentName
  location: location
  tags: tags
  properties: {
    appLogsConfiguration: {
      destination: 'log-analytics'
      logAnalyticsConfiguration: {
        customerId: logAnalytics.properties.customerId
        sharedKey: logAnalytics.listKeys().primarySharedKey
      }
    }
    appInsightsConfiguration: deployAppInsights ? {
      connectionString: appInsights!.properties.ConnectionString
    } : null
    openTelemetryConfiguration: deployAppInsights ? {
      tracesConfiguration: {
        destinations: [
          'appInsights'
        ]
      }
      logsConfiguration: {
        destinations: [
          'appInsights'
        ]
      }
    } : null
    vnetConfiguration: empty(infrastructureSubnetId) ? null : vnetConfiguration
  }
}

// ---------------------------------------------------------------------------------------
// The sendgate Container App
// ---------------------------------------------------------------------------------------

resource app 'Microsoft.App/containerApps@2024-03-01' = {
  name: appName
  location: location
  tags: tags
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identity.id}': {}
    }
  }
  properties: {
    managedEnvironmentId: containerEnvironment.id
    configuration: {
      activeRevisionsMode: 'Single'
      ingress: {
        // In an internal environment (a virtual network, externalIngress=false) "external"
        // means the virtual network: internal ingress would reach only the environment's
        // own apps, not the network the parameter promises.
        external: externalIngress || !empty(infrastructureSubnetId)
        targetPort: containerPort
        transport: 'auto'
        // HTTPS only: plain HTTP is redirected, never served.
        allowInsecure: false
        ipSecurityRestrictions: ipSecurityRestrictions
        traffic: [
          {
            latestRevision: true
            weight: 100
          }
        ]
      }
      // The API keys file comes from Key Vault through the identity: it never appears in a
      // parameter, the template or the deployment history.
      secrets: [
        {
          name: 'api-keys'
          keyVaultUrl: apiKeysSecretUri
          identity: identity.id
        }
      ]
      registries: empty(containerRegistryName) ? [] : registryCredentials
    }
    template: {
      // Longer than the drain window (which holds the linger), so the platform never kills
      // a replica mid-drain.
      terminationGracePeriodSeconds: terminationGracePeriodSeconds
      containers: [
        {
          name: 'sendgate'
          image: image
          resources: {
            cpu: json(cpu)
            memory: memory
          }
          env: concat([
            {
              name: 'SENDGATE_BACKEND'
              value: 'servicebus'
            }
            {
              // Host name from the namespace's endpoint (https://<name>.servicebus.windows.net:443/).
              name: 'SERVICEBUS_NAMESPACE'
              value: split(split(replace(serviceBus.properties.serviceBusEndpoint, 'https://', ''), '/')[0], ':')[0]
            }
            {
              name: 'SENDGATE_QUEUES'
              value: join(queueNames, ',')
            }
            {
              // Entra ID with the user-assigned identity: sendgate picks it by client id,
              // for Service Bus and for Redis (SENDGATE_REDIS_AUTH=entra) alike.
              name: 'SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID'
              value: identity.properties.clientId
            }
            {
              // The conventional variable for Azure SDKs; azure_identity reads it for
              // workload identity. Harmless here, kept for tooling that expects it.
              name: 'AZURE_CLIENT_ID'
              value: identity.properties.clientId
            }
            {
              name: 'SERVICEBUS_SEND_MAX_QUEUE_DEPTH'
              value: string(maxQueueDepth)
            }
            {
              name: 'SERVICEBUS_SEND_FAILCLOSED'
              value: failClosedSetting
            }
            {
              name: 'SERVICEBUS_SEND_FAILCLOSED_STREAK'
              value: string(failClosedStreak)
            }
            {
              name: 'SENDGATE_DEPTH_TTL_MS'
              value: string(depthTtlMs)
            }
            {
              name: 'SENDGATE_DRAIN_TIMEOUT_S'
              value: string(drainTimeoutSeconds)
            }
            {
              name: 'SENDGATE_DRAIN_LINGER_S'
              value: string(drainLingerEffectiveSeconds)
            }
            {
              name: 'SENDGATE_LISTEN'
              value: '0.0.0.0:${containerPort}'
            }
            {
              name: 'SENDGATE_LOG_FORMAT'
              value: 'json'
            }
            {
              // Every connection comes from the Container Apps ingress (Envoy): a per-peer cap
              // would cap the ingress, not a client. The ingress limits clients itself.
              name: 'SENDGATE_MAX_CONNECTIONS_PER_PEER'
              value: '0'
            }
            {
              name: 'SENDGATE_API_KEYS_FILE'
              value: '${apiKeysMountPath}/${apiKeysFileName}'
            }
          ], depthEnv, coordinationEnv, entraEnv, telemetryEnv)
          volumeMounts: [
            {
              volumeName: 'api-keys'
              mountPath: apiKeysMountPath
            }
          ]
          probes: [
            {
              // Up to ~30 s for start-up (listener bound) before liveness applies.
              // (Container Apps caps failureThreshold at 10.)
              type: 'Startup'
              httpGet: {
                path: '/health/live'
                port: containerPort
              }
              initialDelaySeconds: 1
              periodSeconds: 3
              failureThreshold: 10
              timeoutSeconds: 2
            }
            {
              // 200 while the process serves HTTP, also while draining: never restarts a
              // replica that is finishing its sends.
              type: 'Liveness'
              httpGet: {
                path: '/health/live'
                port: containerPort
              }
              periodSeconds: 10
              failureThreshold: 3
              timeoutSeconds: 3
            }
            {
              // 503 while starting or draining: traffic goes to other replicas.
              type: 'Readiness'
              httpGet: {
                path: '/health/ready'
                port: containerPort
              }
              periodSeconds: 5
              failureThreshold: 2
              successThreshold: 1
              timeoutSeconds: 3
            }
          ]
        }
      ]
      volumes: [
        {
          name: 'api-keys'
          storageType: 'Secret'
          secrets: [
            {
              secretRef: 'api-keys'
              path: apiKeysFileName
            }
          ]
        }
      ]
      scale: {
        minReplicas: minReplicas
        maxReplicas: maxReplicas
        rules: [
          {
            name: 'http-concurrency'
            http: {
              metadata: {
                concurrentRequests: string(httpConcurrentRequests)
              }
            }
          }
        ]
      }
    }
  }
  // The roles must exist before the first revision starts: the Key Vault secret is
  // fetched at creation, the image pulled with the identity, and the queues used at once;
  // likewise Redis access (and its private endpoint) before the replicas coordinate.
  dependsOn: [
    apiKeysSecretAccess
    registryPull
    queueSender
    queueReader
    redisAccess
    redisEndpointDns
  ]
}

// ---------------------------------------------------------------------------------------
// Alerts: log alerts on the gateway's JSON events, a 5xx metric alert, one action group
// ---------------------------------------------------------------------------------------

// The streak threshold and the fail-closed flag are the very parameters the container gets
// (SERVICEBUS_SEND_FAILCLOSED_STREAK, SERVICEBUS_SEND_FAILCLOSED), so the alerts cannot
// disagree with the gateway. Referencing the app and the workspace by symbol makes the
// module wait for both.
module alerts 'modules/alerts.bicep' = if (deployAlerts) {
  name: '${namePrefix}-alerts'
  params: {
    location: location
    namePrefix: namePrefix
    tags: tags
    logAnalyticsName: logAnalytics.name
    appName: app.name
    failClosed: failClosed
    failClosedStreak: failClosedStreak
    readDepth: readDepth
    emails: alertEmails
    webhooks: alertWebhooks
    serverErrorsPer5Min: alertServerErrorsPer5Min
  }
}

// ---------------------------------------------------------------------------------------
// Outputs
// ---------------------------------------------------------------------------------------

@description('Host name of the gateway (https://<fqdn>/v1/queues/<queue>/messages).')
output appFqdn string = app.properties.configuration.ingress.fqdn

@description('Client id of the user-assigned identity (SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID / AZURE_CLIENT_ID).')
output identityClientId string = identity.properties.clientId

@description('Principal (object) id of the identity, for role assignments made by others (e.g. the Key Vault owner).')
output identityPrincipalId string = identity.properties.principalId

@description('Service Bus namespace name.')
output serviceBusNamespaceName string = serviceBus.name

@description('Queues created and served.')
output servedQueues array = queueNames

@description('SENDGATE_COORDINATION given to the app: redis when maxReplicas > 1, else local.')
output coordination string = useRedis ? 'redis' : 'local'

@description('Host name of the Redis the replicas share (empty when maxReplicas is 1).')
output redisHostName string = useRedis ? redis!.properties.hostName : ''

@description('terminationGracePeriodSeconds given to the app (drain + margin).')
output terminationGracePeriodSeconds int = terminationGracePeriodSeconds

@description('Application Insights the managed OpenTelemetry agent sends to (empty with deployAppInsights=false).')
output appInsightsName string = deployAppInsights ? appInsights!.name : ''

@description('Resource id of the alerts\' action group (empty with deployAlerts=false).')
output alertActionGroupId string = deployAlerts ? alerts!.outputs.actionGroupId : ''
