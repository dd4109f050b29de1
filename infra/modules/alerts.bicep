// Alerts as code for one sendgate deployment (wired from main.bicep; off with
// deployAlerts=false). infra/README.md ("Alerts") explains each rule and its threshold.
//
// - Four log alerts (Microsoft.Insights/scheduledQueryRules) over the gateway's JSON log
//   lines, which the Container Apps environment ships to the Log Analytics workspace
//   (table ContainerAppConsoleLogs_CL, one JSON object per line in Log_s, because the
//   container gets SENDGATE_LOG_FORMAT=json). They key on the stable `event` field.
// - One metric alert (Microsoft.Insights/metricAlerts) on the Container App's built-in
//   Requests metric, 5xx answers: sendgate logs no line per request, so the platform's
//   count is the only source.
// - One action group; its receivers are parameters (none given: the alerts still fire and
//   show in the portal, they just notify nobody).
//
// The log alerts run as their own user-assigned identity holding only Log Analytics Reader
// on the workspace: no keys, no connection strings, and not the gateway's identity (which
// must not read logs).

@description('Azure region of the rules and the identity (the action group is global).')
param location string

@description('Name prefix, as in main.bicep.')
param namePrefix string

@description('Tags applied to every resource.')
param tags object

@description('Name of the Log Analytics workspace (in this resource group) the environment logs to.')
param logAnalyticsName string

@description('Name of the sendgate Container App (in this resource group): the log lines are filtered on it, and its Requests metric is watched.')
param appName string

@description('SERVICEBUS_SEND_FAILCLOSED as given to the container (main.bicep failClosed).')
param failClosed bool

@description('SERVICEBUS_SEND_FAILCLOSED_STREAK as given to the container (main.bicep failClosedStreak).')
@minValue(1)
param failClosedStreak int

@description('Whether the identity may read the queue depth (main.bicep readDepth).')
param readDepth bool

@description('E-mail addresses to notify. Empty: no e-mail receivers.')
param emails array = []

@description('Webhooks to call, as { "<receiver name>": "https://..." }. Secure: such URLs often embed a token, so they stay out of the deployment history. HTTPS only (the deployment fails otherwise). Empty: no webhook receivers.')
@secure()
param webhooks object = {}

@description('5xx answers in 5 minutes at or above which the 5xx alert fires.')
@minValue(1)
param serverErrorsPer5Min int = 20

// ---------------------------------------------------------------------------------------
// Constants
// ---------------------------------------------------------------------------------------

// Azure Monitor severities: 0 critical, 1 error, 2 warning, 3 informational.
var sevError = 1
var sevWarning = 2
var sevInfo = 3

// Every log alert starts from the gateway's own lines, parsed once. The empty datatable
// in a fuzzy union keeps the query valid before the environment has written its first line
// (the custom table does not exist in a new workspace until then): no rows, no alert, no
// query error. The substring test drops most lines before the JSON is parsed (`contains`,
// not `has`: whether `_` splits terms in the index is not worth betting an alert on). A line
// that is not JSON parses to a string, whose `event` is empty: filtered out, and a field
// that is missing is null after toint/tostring, which each rule treats explicitly.
var logsOfApp = '''
union isfuzzy=true
    (datatable(TimeGenerated: datetime, ContainerAppName_s: string, RevisionName_s: string, Log_s: string)[]),
    (ContainerAppConsoleLogs_CL | project TimeGenerated, ContainerAppName_s, RevisionName_s, Log_s)
| where ContainerAppName_s == '{0}'
| where Log_s contains '{1}'
| extend line = parse_json(Log_s)
| where tostring(line.event) == '{1}'
'''

// Guard: a webhook over plain HTTP would carry the alert (and any token in its URL) in the
// clear. ARM evaluates only the branch taken, so this errors only for such a URL.
var webhookGuard = 'alert webhooks must be https:// URLs'
var webhookReceivers = [
  for hook in items(webhooks): {
    name: hook.key
    serviceUri: startsWith(toLower(hook.value), 'https://') ? hook.value : string(int(webhookGuard))
    useCommonAlertSchema: true
  }
]
var emailReceivers = [
  for (address, i) in emails: {
    name: 'email-${i}'
    emailAddress: address
    useCommonAlertSchema: true
  }
]

// ---------------------------------------------------------------------------------------
// Existing resources, identity and its one role
// ---------------------------------------------------------------------------------------

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' existing = {
  name: logAnalyticsName
}

resource app 'Microsoft.App/containerApps@2024-03-01' existing = {
  name: appName
}

resource alertsIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: '${namePrefix}-alerts-id'
  location: location
  tags: tags
}

// Named from the identity's principal id (in a module: see queue-role.bicep).
module alertsReader 'workspace-reader.bicep' = {
  name: '${namePrefix}-alerts-reader'
  params: {
    workspaceName: workspace.name
    principalId: alertsIdentity.properties.principalId
  }
}

var ruleIdentity = {
  type: 'UserAssigned'
  userAssignedIdentities: {
    '${alertsIdentity.id}': {}
  }
}

// ---------------------------------------------------------------------------------------
// Action group
// ---------------------------------------------------------------------------------------

resource actionGroup 'Microsoft.Insights/actionGroups@2023-01-01' = {
  name: '${namePrefix}-alerts'
  location: 'Global'
  tags: tags
  properties: {
    // At most 12 characters: shown in SMS and e-mail subjects.
    groupShortName: take(namePrefix, 12)
    enabled: true
    emailReceivers: emailReceivers
    webhookReceivers: webhookReceivers
  }
}

// ---------------------------------------------------------------------------------------
// Log alerts
// ---------------------------------------------------------------------------------------

// 1. Sends refused by fail-closed: clients are getting 503 capacity_unknown. Any line fires.
resource failClosedRefusals 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: '${namePrefix}-send-failclosed'
  location: location
  tags: tags
  kind: 'LogAlert'
  identity: ruleIdentity
  properties: {
    displayName: 'sendgate: sends refused (fail-closed, 503 capacity_unknown)'
    description: 'The gateway refused sends because it could not read the queue depth for SERVICEBUS_SEND_FAILCLOSED_STREAK reads (event send_failclosed). Check /health/detailed (consecutive_failures, the depth read error) and the identity\'s Data Owner role on the queue.'
    severity: sevError
    enabled: true
    scopes: [
      workspace.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    criteria: {
      allOf: [
        {
          query: '${format(logsOfApp, appName, 'send_failclosed')}| extend queue = tostring(line.queue), consecutive_failures = toint(line.consecutive_failures), refused_since_last_log = toint(line.refused_since_last_log)\n'
          timeAggregation: 'Count'
          dimensions: [
            {
              name: 'queue'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: true
    // The workspace and its identity's role may be minutes old: validated at evaluation.
    skipQueryValidation: true
    actions: {
      actionGroups: [
        actionGroup.id
      ]
    }
  }
  dependsOn: [
    alertsReader
  ]
}

// 2. A circuit breaker opened: sends to that backend fail fast (503 backend_unavailable) or
// go to the fallback.
resource breakerOpen 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: '${namePrefix}-breaker-open'
  location: location
  tags: tags
  kind: 'LogAlert'
  identity: ruleIdentity
  properties: {
    displayName: 'sendgate: circuit breaker open'
    description: 'A backend failed often enough that its circuit breaker opened (event breaker_open): sends to it fail fast or go to the fallback until a probe closes it. Look at send_failed / servicebus_send_failed lines just before.'
    severity: sevWarning
    enabled: true
    scopes: [
      workspace.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    criteria: {
      allOf: [
        {
          query: '${format(logsOfApp, appName, 'breaker_open')}| extend backend = tostring(line.backend), why = tostring(line.why)\n'
          timeAggregation: 'Count'
          dimensions: [
            {
              name: 'backend'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: true
    skipQueryValidation: true
    actions: {
      actionGroups: [
        actionGroup.id
      ]
    }
  }
  dependsOn: [
    alertsReader
  ]
}

// 3. Depth reads failing for a streak while the fail-closed gate is off: sends proceed and
// the ceiling is not enforced, silently (with the gate on, rule 1 covers it). Not created
// without readDepth: there every read fails by design and the ceiling is knowingly off.
//
// Every depth_read_failed line carries the streak (consecutive_failures): a replica's own
// gate's, or the fleet's as published (SENDGATE_COORDINATION=redis). A line at or over the
// threshold counts the full threshold; a line without the field (an older gateway) counts 1.
resource depthStreak 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = if (!failClosed && readDepth) {
  name: '${namePrefix}-depth-read-streak'
  location: location
  tags: tags
  kind: 'LogAlert'
  identity: ruleIdentity
  properties: {
    displayName: 'sendgate: queue depth unreadable, ceiling not enforced'
    description: 'Depth reads failed ${failClosedStreak} times in a row (SERVICEBUS_SEND_FAILCLOSED_STREAK) while SERVICEBUS_SEND_FAILCLOSED is off: sends are admitted without the backlog ceiling (event depth_read_failed). Check /health/detailed and the identity\'s Data Owner role on the queue.'
    severity: sevWarning
    enabled: true
    scopes: [
      workspace.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    criteria: {
      allOf: [
        {
          query: '${format(logsOfApp, appName, 'depth_read_failed')}| extend queue = tostring(line.queue), streak = toint(line.consecutive_failures)\n| extend toward_threshold = iff(isnull(streak), 1, iff(streak >= ${failClosedStreak}, ${failClosedStreak}, 0))\n'
          timeAggregation: 'Total'
          metricMeasureColumn: 'toward_threshold'
          dimensions: [
            {
              name: 'queue'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          operator: 'GreaterThanOrEqual'
          threshold: failClosedStreak
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: true
    skipQueryValidation: true
    actions: {
      actionGroups: [
        actionGroup.id
      ]
    }
  }
  dependsOn: [
    alertsReader
  ]
}

// 4. A drain ended with sends still in flight (cut_off = how many; 0 is a clean drain):
// those clients got no answer and will retry. The window (SENDGATE_DRAIN_TIMEOUT_S) is too
// short for the sends' latency, or a second signal ended it. cut_off is a count today; a
// boolean true is accepted too.
resource drainCutOff 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: '${namePrefix}-drain-cut-off'
  location: location
  tags: tags
  kind: 'LogAlert'
  identity: ruleIdentity
  properties: {
    displayName: 'sendgate: drain cut off sends in flight'
    description: 'A replica stopped with sends still in flight (event drain_finished, cut_off > 0): its drain window (SENDGATE_DRAIN_TIMEOUT_S, main.bicep drainTimeoutSeconds) ran out or a second signal ended it. Those sends got no 2xx; producers retry them (duplicate detection stores each once).'
    severity: sevInfo
    enabled: true
    scopes: [
      workspace.id
    ]
    evaluationFrequency: 'PT15M'
    windowSize: 'PT15M'
    criteria: {
      allOf: [
        {
          query: '${format(logsOfApp, appName, 'drain_finished')}| extend cut_off = line.cut_off\n| where tostring(cut_off) == \'true\' or toreal(cut_off) > 0\n'
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: true
    skipQueryValidation: true
    actions: {
      actionGroups: [
        actionGroup.id
      ]
    }
  }
  dependsOn: [
    alertsReader
  ]
}

// ---------------------------------------------------------------------------------------
// Metric alert: 5xx answers
// ---------------------------------------------------------------------------------------

// 5. The platform's count of 5xx answers (ingress), per 5 minutes. sendgate logs no line
// per request, so no log query can compute this; a metric alert compares counts, not
// ratios, so the threshold is a count (serverErrorsPer5Min).
resource serverErrors 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: '${namePrefix}-5xx'
  location: 'global'
  tags: tags
  properties: {
    description: 'At least ${serverErrorsPer5Min} answers with a 5xx status in 5 minutes (Requests metric, statusCodeCategory 5xx): 502/504 from the backend, 503 while draining, saturated, fail-closed or with the breaker open.'
    severity: sevWarning
    enabled: true
    scopes: [
      app.id
    ]
    evaluationFrequency: 'PT1M'
    windowSize: 'PT5M'
    targetResourceType: 'Microsoft.App/containerApps'
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'server-errors'
          metricNamespace: 'Microsoft.App/containerApps'
          metricName: 'Requests'
          timeAggregation: 'Total'
          operator: 'GreaterThanOrEqual'
          threshold: serverErrorsPer5Min
          dimensions: [
            {
              name: 'statusCodeCategory'
              operator: 'Include'
              values: [
                '5xx'
              ]
            }
          ]
        }
      ]
    }
    autoMitigate: true
    actions: [
      {
        actionGroupId: actionGroup.id
      }
    ]
  }
}

@description('Resource id of the action group (other rules may notify it too).')
output actionGroupId string = actionGroup.id
