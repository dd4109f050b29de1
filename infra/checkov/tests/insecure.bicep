// Test fixture, never deployed: one resource per project policy, each breaking it.
// scripts/lint-infra.sh checks that every CKV_SENDGATE_* check FAILS here (and passes on
// main.bicep), so a policy that matches nothing or accepts anything is caught. The main
// checkov scan skips this directory.

param useRedis bool = true

resource namespaceWeak 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: 'fixture-sb'
  location: 'westeurope'
  sku: {
    name: 'Standard'
  }
  properties: {
    minimumTlsVersion: '1.0'
    disableLocalAuth: false
  }
}

resource queueNoDedup 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = {
  parent: namespaceWeak
  name: 'requests'
  properties: {
    requiresDuplicateDetection: false
  }
}

resource appInsecure 'Microsoft.App/containerApps@2024-03-01' = {
  name: 'fixture-app'
  location: 'westeurope'
  properties: {
    configuration: {
      ingress: {
        external: true
        targetPort: 80
        allowInsecure: true
      }
      secrets: [
        {
          name: 'api-keys'
          value: 'inline-secret-value'
        }
      ]
    }
    template: {
      containers: [
        {
          name: 'sendgate'
          image: 'example.invalid/sendgate:0'
        }
      ]
    }
  }
}

resource ownerEverywhere 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, 'owner')
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '8e3af657-a8ff-443c-a75c-2fe8c4bcb635')
    principalId: '00000000-0000-0000-0000-000000000000'
  }
}

resource fixtureIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: 'fixture-id'
  location: 'westeurope'
}

// Data Owner (the Manage right) on a queue, named from the identity's resource id.
resource queueOwnerById 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(queueNoDedup.id, fixtureIdentity.id, '090c5cfd-751d-490a-894a-3ce6f1109419')
  scope: queueNoDedup
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '090c5cfd-751d-490a-894a-3ce6f1109419')
    principalId: fixtureIdentity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

resource redisOpen 'Microsoft.Cache/redisEnterprise@2025-07-01' = if (useRedis) {
  name: 'fixture-redis'
  location: 'westeurope'
  sku: {
    name: 'Balanced_B1'
  }
  properties: {
    minimumTlsVersion: '1.0'
    publicNetworkAccess: 'Enabled'
  }
}

resource redisPlainWithKeys 'Microsoft.Cache/redisEnterprise/databases@2025-07-01' = if (useRedis) {
  parent: redisOpen
  name: 'default'
  properties: {
    clientProtocol: 'Plaintext'
    port: 10000
    accessKeysAuthentication: 'Enabled'
  }
}

// One broken property at a time, so each half of a check's condition is exercised.

resource namespaceOldTls 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: 'fixture-sb-tls'
  location: 'westeurope'
  sku: {
    name: 'Standard'
  }
  properties: {
    minimumTlsVersion: '1.1'
    disableLocalAuth: true
  }
}

resource namespaceSas 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: 'fixture-sb-sas'
  location: 'westeurope'
  sku: {
    name: 'Standard'
  }
  properties: {
    minimumTlsVersion: '1.2'
    disableLocalAuth: false
  }
}

resource redisPublicLiteral 'Microsoft.Cache/redisEnterprise@2025-07-01' = {
  name: 'fixture-redis-public'
  location: 'westeurope'
  sku: {
    name: 'Balanced_B1'
  }
  properties: {
    minimumTlsVersion: '1.2'
    publicNetworkAccess: 'Enabled'
  }
}

resource redisOldTls 'Microsoft.Cache/redisEnterprise@2025-07-01' = {
  name: 'fixture-redis-tls'
  location: 'westeurope'
  sku: {
    name: 'Balanced_B1'
  }
  properties: {
    minimumTlsVersion: '1.1'
    publicNetworkAccess: 'Disabled'
  }
}

resource redisNetworkUnset 'Microsoft.Cache/redisEnterprise@2025-07-01' = {
  name: 'fixture-redis-unset'
  location: 'westeurope'
  sku: {
    name: 'Balanced_B1'
  }
  properties: {
    minimumTlsVersion: '1.2'
  }
}

resource redisKeysOn 'Microsoft.Cache/redisEnterprise/databases@2025-07-01' = {
  parent: redisOldTls
  name: 'default'
  properties: {
    clientProtocol: 'Encrypted'
    accessKeysAuthentication: 'Enabled'
  }
}

resource redisPlaintext 'Microsoft.Cache/redisEnterprise/databases@2025-07-01' = {
  parent: redisPublicLiteral
  name: 'default'
  properties: {
    clientProtocol: 'Plaintext'
    accessKeysAuthentication: 'Disabled'
  }
}

resource redisDefaults 'Microsoft.Cache/redisEnterprise/databases@2025-07-01' = {
  parent: redisNetworkUnset
  name: 'default'
  properties: {
    port: 10000
  }
}

// Alerts: rules that notify nobody or run as nobody, action groups that send the alert in
// the clear or in a legacy schema.

param hookUrls array = []

resource ruleDisabled 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: 'fixture-rule-disabled'
  location: 'westeurope'
  kind: 'LogAlert'
  properties: {
    enabled: false
    severity: 1
    scopes: []
    criteria: {
      allOf: []
    }
    actions: {
      actionGroups: [
        groupDisabled.id
      ]
    }
  }
}

resource ruleNoActions 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: 'fixture-rule-silent'
  location: 'westeurope'
  kind: 'LogAlert'
  identity: {
    type: 'None'
  }
  properties: {
    enabled: true
    severity: 1
    scopes: []
    criteria: {
      allOf: []
    }
  }
}

resource ruleEmptyActions 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: 'fixture-rule-empty'
  location: 'westeurope'
  kind: 'LogAlert'
  identity: {
    type: 'UserAssigned'
  }
  properties: {
    enabled: true
    severity: 1
    scopes: []
    criteria: {
      allOf: []
    }
    actions: {
      actionGroups: []
    }
  }
}

resource metricDisabled 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: 'fixture-metric-disabled'
  location: 'global'
  properties: {
    enabled: false
    severity: 2
    scopes: []
    evaluationFrequency: 'PT1M'
    windowSize: 'PT5M'
    criteria: {}
    actions: [
      {
        actionGroupId: groupDisabled.id
      }
    ]
  }
}

resource metricSilent 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: 'fixture-metric-silent'
  location: 'global'
  properties: {
    enabled: true
    severity: 2
    scopes: []
    evaluationFrequency: 'PT1M'
    windowSize: 'PT5M'
    criteria: {}
    actions: []
  }
}

resource groupDisabled 'Microsoft.Insights/actionGroups@2023-01-01' = {
  name: 'fixture-group-disabled'
  location: 'Global'
  properties: {
    groupShortName: 'fixture'
    enabled: false
  }
}

resource groupPlainHttp 'Microsoft.Insights/actionGroups@2023-01-01' = {
  name: 'fixture-group-http'
  location: 'Global'
  properties: {
    groupShortName: 'fixture'
    enabled: true
    webhookReceivers: [
      {
        name: 'plain'
        serviceUri: 'http://hooks.example.invalid/alert'
        useCommonAlertSchema: true
      }
    ]
  }
}

resource groupLegacySchema 'Microsoft.Insights/actionGroups@2023-01-01' = {
  name: 'fixture-group-legacy'
  location: 'Global'
  properties: {
    groupShortName: 'fixture'
    enabled: true
    emailReceivers: [
      {
        name: 'ops'
        emailAddress: 'ops@example.invalid'
        useCommonAlertSchema: false
      }
    ]
  }
}

resource groupLoopLegacy 'Microsoft.Insights/actionGroups@2023-01-01' = {
  name: 'fixture-group-loop'
  location: 'Global'
  properties: {
    groupShortName: 'fixture'
    enabled: true
    webhookReceivers: [
      for (url, i) in hookUrls: {
        name: 'hook-${i}'
        serviceUri: url
      }
    ]
  }
}

// CKV_SENDGATE_12: Application Insights without a workspace, and one that ingests apart.
resource insightsClassic 'Microsoft.Insights/components@2020-02-02' = {
  name: 'fixture-insights-classic'
  location: 'westeurope'
  kind: 'web'
  properties: {
    Application_Type: 'web'
  }
}

resource insightsApart 'Microsoft.Insights/components@2020-02-02' = {
  name: 'fixture-insights-apart'
  location: 'westeurope'
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: '/subscriptions/0/resourceGroups/x/providers/Microsoft.OperationalInsights/workspaces/w'
    IngestionMode: 'ApplicationInsights'
  }
}
