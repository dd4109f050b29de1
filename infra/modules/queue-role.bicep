// Grants one principal one of two built-in roles on ONE Service Bus queue. A module, so that the
// assignment's name can be built from the principal id: inside main.bicep that id is known
// only once the identity is deployed, too late for a resource name. A name built from the
// identity's resource id instead would survive the identity being deleted and recreated
// under the same name, and the next deployment would then try to change the principal of
// an existing assignment, which Azure refuses (RoleAssignmentUpdateNotPermitted).

@description('Name of the existing Service Bus namespace (in this module\'s resource group).')
param namespaceName string

@description('Name of the queue in that namespace.')
param queueName string

@description('Principal (object) id that gets the role.')
param principalId string

@description('send: "Azure Service Bus Data Sender" (the sends). read: "Reader" (the queue resource, for its message counts; no data-plane right).')
@allowed([
  'send'
  'read'
])
param right string

@description('What the assignment is for (shown in the portal).')
param purpose string

// Built-in roles: Azure Service Bus Data Sender; Reader.
var roleId = right == 'send' ? '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39' : 'acdd72a7-3385-48ef-bd42-f606fba81ae7'

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: namespaceName
}

resource queue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' existing = {
  parent: namespace
  name: queueName
}

resource assignment 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(queue.id, principalId, roleId)
  scope: queue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleId)
    principalId: principalId
    principalType: 'ServicePrincipal'
    description: purpose
  }
}
