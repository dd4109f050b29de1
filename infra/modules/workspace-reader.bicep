// Grants one principal "Log Analytics Reader" on one existing workspace (in this module's
// resource group): the alerts' identity runs its log queries with it. A module so that the
// assignment's name is built from the principal id (see queue-role.bicep for why).

@description('Name of the existing Log Analytics workspace.')
param workspaceName string

@description('Principal (object) id that runs the queries.')
param principalId string

// Built-in role "Log Analytics Reader" (holds workspaces/analytics/query/action).
var logAnalyticsReaderRoleId = '73c42c96-874c-492b-b04d-ab87d138a893'

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' existing = {
  name: workspaceName
}

resource alertsReader 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(workspace.id, principalId, logAnalyticsReaderRoleId)
  scope: workspace
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', logAnalyticsReaderRoleId)
    principalId: principalId
    principalType: 'ServicePrincipal'
    description: 'sendgate alerts: run the log alert queries on this workspace'
  }
}
